/* lp_window.c — low priority's in-flight window per card, in device time, and whether its
 * queued work waits on the card's gate word on the GPU (the device gate): set by the owner at
 * run time, read by launchers (the window at every batch, the device gate when they bind);
 * and the window rule itself, which every launcher applies. */
#include "node.h"

int qs_lp_window_admits(uint64_t queued_ns, uint64_t window_ns)
{
    return queued_ns == 0 || queued_ns < window_ns;
}

uint64_t qs_lp_window_in_force(uint64_t window_ns, int device_gate)
{
    return device_gate && window_ns < QS_LP_WINDOW_ALONE_NS ? QS_LP_WINDOW_ALONE_NS : window_ns;
}

uint64_t qs_card_lp_window(const struct qs_cfg_card *card)
{
    uint64_t ns = atomic_load_explicit(&card->lp_window_ns, memory_order_relaxed);
    return ns ? ns : QS_DEFAULT_LP_WINDOW_NS;
}

int qs_card_set_lp_window(qs_node *node, uint32_t index, uint64_t window_ns)
{
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    if (window_ns < 1000 || window_ns > QS_MAX_LP_WINDOW_NS)
        return qs_fail(QS_EINVAL, "LP window %llu ns is outside 1 us .. %llu ns",
                       (unsigned long long)window_ns, (unsigned long long)QS_MAX_LP_WINDOW_NS);
    atomic_store(&node->seg.cfg->cards[index].lp_window_ns, window_ns);
    return QS_OK;
}

int qs_card_set_lp_device_gate(qs_node *node, uint32_t index, int enable)
{
    int rc = qs_node_check_card(node, index);
    if (rc != QS_OK)
        return rc;
    if (enable != 0 && enable != 1)
        return qs_fail(QS_EINVAL, "the LP device gate is 0 (off) or 1 (on), not %d", enable);
    atomic_store(&node->seg.cfg->cards[index].lp_device_gate, (uint32_t)enable);
    return QS_OK;
}
