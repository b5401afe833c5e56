/* lp_window.c — low priority's in-flight window per card, in device time: set by the owner
 * at run time, read by launchers at every launch (one atomic load). */
#include "node.h"

uint64_t qs_card_lp_window(const struct qs_cfg_card *card)
{
    uint64_t ns = atomic_load_explicit(&card->lp_window_ns, memory_order_relaxed);
    return ns ? ns : QS_DEFAULT_LP_WINDOW_NS;
}

int qs_card_set_lp_window(qs_node *node, uint32_t index, uint64_t window_ns)
{
    qs_clear_error();
    QS_REQUIRE(node, "node");
    if (index >= QS_MAX_CARDS || !atomic_load(&node->seg.cfg->cards[index].present))
        return qs_fail(QS_ENOENT, "no card with index %u", index);
    if (window_ns < 1000 || window_ns > QS_MAX_LP_WINDOW_NS)
        return qs_fail(QS_EINVAL, "LP window %llu ns is outside 1 us .. %llu ns",
                       (unsigned long long)window_ns, (unsigned long long)QS_MAX_LP_WINDOW_NS);
    atomic_store(&node->seg.cfg->cards[index].lp_window_ns, window_ns);
    return QS_OK;
}
