/* visible.c — CUDA_VISIBLE_DEVICES of a container whose vGPUs come from several claims: each
 * card of its vGPUs is named by QSHARE_VISIBLE_<INDEX>=<CARD_UUID> (<INDEX> the card's index
 * on the node), a variable per card that survives a runtime's merge of several claims' CDI
 * edits where one CUDA_VISIBLE_DEVICES keeps one claim's value. When the library loads, before
 * the driver's cuInit reads it, CUDA_VISIBLE_DEVICES is set to those cards in index order; a
 * value already set (by the pod, a launcher, `qshare run`) is left as it is (docs/cuda.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_uuid.h"
#include "interposer.h"

#define VISIBLE "CUDA_VISIBLE_DEVICES"
#define PREFIX "QSHARE_VISIBLE_"
#define MAX_CARDS 64
#define MAX_INDEX 1023ul
#define LEFT VISIBLE " is left unset (every card the container reaches is visible)"

typedef struct shown_card {
    unsigned long index;
    char uuid[QSC_UUID_TEXT_LEN];
    char var[64]; /* the variable that named it, for messages */
} shown_card;

/* The card of one QSHARE_VISIBLE_<INDEX>=<UUID> (`item` as environ holds it); 0 with a
 * message naming the variable when its index or UUID is malformed. */
static int parse_card(const char *item, shown_card *c) {
    const char *eq = strchr(item, '=');
    snprintf(c->var, sizeof c->var, "%.*s", (int)(eq - item), item);
    const char *index = c->var + strlen(PREFIX);
    char bytes[16];
    if ((size_t)(eq - item) >= sizeof c->var || !qsc_parse_whole(index, MAX_INDEX, &c->index)) {
        qsc_warn_once(QSC_WARN_VISIBLE, "%s: '%s' after " PREFIX " is not a card index (0 to "
                      "%lu). " LEFT, c->var, index, MAX_INDEX);
        return 0;
    }
    if (!qsc_uuid_parse(eq + 1, bytes)) {
        qsc_warn_once(QSC_WARN_VISIBLE, "%s='%s' is not a card UUID (GPU-xxxxxxxx-xxxx-xxxx-"
                      "xxxx-xxxxxxxxxxxx). " LEFT, c->var, eq + 1);
        return 0;
    }
    snprintf(c->uuid, sizeof c->uuid, "%s", eq + 1);
    return 1;
}

/* Where `c` goes among the `n` cards read (sorted by index): its slot, `n` + 1 when it is
 * there already (the same index and card, named again), -1 with a message when it
 * contradicts one (one index, two cards; or one card, two indexes). */
static int slot_for(const shown_card *cards, int n, const shown_card *c) {
    int at = n;
    for (int i = 0; i < n; i++) {
        int same_index = cards[i].index == c->index, same_card = !strcmp(cards[i].uuid, c->uuid);
        if (same_index && same_card) return n + 1;
        if (same_index || same_card) {
            qsc_warn_once(QSC_WARN_VISIBLE, "%s=%s contradicts %s=%s. " LEFT, c->var, c->uuid,
                          cards[i].var, cards[i].uuid);
            return -1;
        }
        if (at == n && cards[i].index > c->index) at = i;
    }
    return at;
}

/* Every QSHARE_VISIBLE_<INDEX> card of `env`, by index, into `cards`: how many, or -1 after
 * a message naming what is wrong. */
static int read_cards(char *const *env, shown_card *cards) {
    int n = 0;
    for (char *const *p = env; p != NULL && *p != NULL; p++) {
        if (strncmp(*p, PREFIX, strlen(PREFIX)) != 0 || strchr(*p, '=') == NULL) continue;
        shown_card c;
        if (!parse_card(*p, &c)) return -1;
        int at = slot_for(cards, n, &c);
        if (at < 0) return -1;
        if (at > n) continue;
        if (n == MAX_CARDS) {
            qsc_warn_once(QSC_WARN_VISIBLE, "%s: more than %d cards. " LEFT, c.var, MAX_CARDS);
            return -1;
        }
        memmove(&cards[at + 1], &cards[at], (size_t)(n - at) * sizeof cards[0]);
        cards[at] = c;
        n++;
    }
    return n;
}

int qsc_visible_compose(char *const *env, char *out, size_t len) {
    shown_card cards[MAX_CARDS];
    int n = read_cards(env, cards);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        int wrote = snprintf(out + used, len - used, "%s%s", i ? "," : "", cards[i].uuid);
        if (wrote < 0 || (size_t)wrote >= len - used) return -1;
        used += (size_t)wrote;
    }
    return n;
}

/* At load: the program and the driver find CUDA_VISIBLE_DEVICES set from the start (a
 * constructor runs before main, and before threads that could read the environment). */
__attribute__((constructor)) static void compose_visible(void) {
    char list[MAX_CARDS * QSC_UUID_TEXT_LEN];
    if (getenv(VISIBLE) != NULL || qsc_visible_compose(environ, list, sizeof list) <= 0) return;
    if (setenv(VISIBLE, list, 0) != 0)
        qsc_warn_once(QSC_WARN_VISIBLE, "cannot set " VISIBLE "=%s. " LEFT, list);
}
