/* vgpu_set.c — the vGPUs a process may be served by, read from its environment: one
 * QSHARE_VGPU_<ID>=<CARD_UUID> per vGPU the container holds (the card each is on), or,
 * when there is none, QSHARE_VGPU=ID (one vGPU, its card taken from the segment). */
#include <stdio.h>
#include <string.h>

#include "gpu_uuid.h"
#include "interposer.h"

#define PREFIX "QSHARE_VGPU_"
#define FAILS "CUDA calls will fail with CUDA_ERROR_NOT_INITIALIZED"

/* QSHARE_VGPU=ID as the one entry (no card named). 0 with a message on failure. */
static int read_single(const char *text, qsc_vgpu_set *out) {
    unsigned long v = 0;
    if (text == NULL || *text == '\0') {
        qsc_warn_once(QSC_WARN_ATTACH, "QSHARE_VGPU is not set; start the program with `qshare run "
                                       "--vgpu ID -- CMD`. " FAILS);
        return 0;
    }
    if (!qsc_parse_whole(text, UINT32_MAX, &v)) {
        qsc_warn_once(QSC_WARN_ATTACH, "QSHARE_VGPU=%s is not a vGPU id. " FAILS, text);
        return 0;
    }
    out->n = 1;
    out->entries[0] = (qsc_vgpu_entry){.id = (uint32_t)v, .has_card = 0};
    snprintf(out->entries[0].var, sizeof out->entries[0].var, "QSHARE_VGPU");
    return 1;
}

/* The entry of one QSHARE_VGPU_<ID>=<UUID> variable (`item` as environ holds it). */
static int parse_item(const char *item, qsc_vgpu_entry *e) {
    const char *eq = strchr(item, '=');
    size_t name_len = (size_t)(eq - item);
    snprintf(e->var, sizeof e->var, "%.*s", (int)name_len, item);
    char id_text[16];
    size_t id_len = name_len - strlen(PREFIX);
    unsigned long v = 0;
    snprintf(id_text, sizeof id_text, "%.*s", (int)id_len, item + strlen(PREFIX));
    if (id_len >= sizeof id_text || !qsc_parse_whole(id_text, UINT32_MAX, &v)) {
        qsc_warn_once(QSC_WARN_ATTACH, "%s: '%s' after " PREFIX " is not a vGPU id. " FAILS,
                      e->var, e->var + strlen(PREFIX));
        return 0;
    }
    e->id = (uint32_t)v;
    e->has_card = qsc_uuid_parse(eq + 1, e->bytes);
    if (!e->has_card) {
        qsc_warn_once(QSC_WARN_ATTACH, "%s='%s' is not a card UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                      "xxxxxxxxxxxx). " FAILS, e->var, eq + 1);
        return 0;
    }
    qsc_uuid_format(e->bytes, e->uuid);
    return 1;
}

/* 0 with a message when `e` repeats an entry's vGPU id, else 1; `same_card` is the slot of
 * the entry on `e`'s card, -1 for none. */
static int distinct(const qsc_vgpu_set *set, const qsc_vgpu_entry *e, int *same_card) {
    *same_card = -1;
    for (int i = 0; i < set->n; i++) {
        const qsc_vgpu_entry *o = &set->entries[i];
        if (o->id == e->id) {
            qsc_warn_once(QSC_WARN_ATTACH, "%s names vGPU %u, as %s does. " FAILS, e->var, e->id,
                          o->var);
            return 0;
        }
        if (memcmp(o->bytes, e->bytes, sizeof e->bytes) == 0) *same_card = i;
    }
    return 1;
}

/* Two vGPUs of the set on one card (two claims of a container, or two requests of a claim,
 * allocated on the same card): a process is served by one vGPU per card, the lower id, which
 * is kept in slot `at`; the other is left to another process of the container (one started
 * without the kept vGPU's variable). Said once. */
static void keep_lower(qsc_vgpu_set *set, int at, const qsc_vgpu_entry *e) {
    qsc_vgpu_entry *o = &set->entries[at];
    const qsc_vgpu_entry *kept = e->id < o->id ? e : o, *left = e->id < o->id ? o : e;
    qsc_warn_once(QSC_WARN_SHARED_CARD, "%s and %s are both on card %s: this process is served "
                  "by vGPU %u (the lower id); a process started without %s is served by vGPU %u",
                  kept->var, left->var, kept->uuid, kept->id, kept->var, left->id);
    if (kept == e) *o = *e;
}

int qsc_vgpu_set_read(char *const *env, qsc_vgpu_set *out) {
    out->n = 0;
    for (char *const *p = env; p != NULL && *p != NULL; p++) {
        if (strncmp(*p, PREFIX, strlen(PREFIX)) != 0 || strchr(*p, '=') == NULL) continue;
        qsc_vgpu_entry e;
        int same_card;
        if (!parse_item(*p, &e) || !distinct(out, &e, &same_card)) return 0;
        if (same_card >= 0) {
            keep_lower(out, same_card, &e);
            continue;
        }
        if (out->n == QSC_MAX_VGPUS) {
            qsc_warn_once(QSC_WARN_ATTACH, "%s: more than %d " PREFIX "<ID> variables. " FAILS,
                          e.var, QSC_MAX_VGPUS);
            return 0;
        }
        out->entries[out->n++] = e;
    }
    return out->n > 0 || read_single(getenv("QSHARE_VGPU"), out);
}

int qsc_vgpu_set_find(const qsc_vgpu_set *set, const char bytes[16]) {
    for (int i = 0; i < set->n; i++)
        if (set->entries[i].has_card && memcmp(set->entries[i].bytes, bytes, 16) == 0) return i;
    return -1;
}

void qsc_vgpu_set_describe(const qsc_vgpu_set *set, char *out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < set->n && used < len; i++) {
        int n = snprintf(out + used, len - used, "%svGPU %u on %s", i ? ", " : "",
                         set->entries[i].id, set->entries[i].uuid);
        if (n < 0) break;
        used += (size_t)n;
    }
}
