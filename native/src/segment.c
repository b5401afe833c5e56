/* segment.c — the node segment: two files in one directory, a configuration part only
 * the owner can write (0644) and a state part for clients (0660); each opens only if
 * its magic, ABI version and size match. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFG_MODE 0644
#define STATE_MODE 0660

const char *qs_default_dir(const char *dir)
{
    if (dir && *dir)
        return dir;
    const char *env = getenv("QSHARE_SHM_DIR");
    return env && *env ? env : "/dev/shm";
}

int qs_check_name(const char *name)
{
    if (!name || !*name)
        return qs_fail(QS_ENAME, "segment name is empty");
    size_t len = strlen(name);
    if (len >= QS_NAME_MAX)
        return qs_fail(QS_ENAME, "segment name '%.20s...' is %zu characters; at most %u allowed",
                       name, len, QS_NAME_MAX - 1);
    if (name[0] == '.')
        return qs_fail(QS_ENAME, "segment name '%s' must not start with '.'", name);
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.';
        if (!ok)
            return qs_fail(QS_ENAME, "segment name '%s' has '%c'; use letters, digits, '-', '_', '.'",
                           name, c);
    }
    return QS_OK;
}

int qs_segment_path(char *buf, size_t len, const char *dir, const char *name, const char *suffix)
{
    int n = snprintf(buf, len, "%s/qshare.%s.%s", qs_default_dir(dir), name, suffix);
    if (n < 0 || (size_t)n >= len)
        return qs_fail(QS_EINVAL, "segment directory path is too long");
    return QS_OK;
}

static int create_file(const char *path, size_t size, mode_t mode, void **map)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return errno == EEXIST ? qs_fail(QS_EEXIST, "segment file %s already exists", path)
                               : qs_fail_errno(path);
    int rc = QS_OK;
    if (fchmod(fd, mode) || ftruncate(fd, (off_t)size))
        rc = qs_fail_errno(path);
    if (rc == QS_OK) {
        *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (*map == MAP_FAILED)
            rc = qs_fail_errno("mmap");
    }
    close(fd);
    if (rc != QS_OK)
        unlink(path);
    return rc;
}

static int init_state(struct qs_state *st)
{
    int rc = qs_robust_init(&st->seg_lock);
    for (uint32_t v = 0; rc == QS_OK && v < QS_MAX_VGPUS; v++)
        rc = qs_robust_init(&st->vgpus[v].mem_lock);
    st->abi = QS_ABI_VERSION;
    st->state_size = sizeof *st;
    atomic_thread_fence(memory_order_release);
    st->magic = QS_STATE_MAGIC; /* last: a half-made segment never validates */
    return rc;
}

static void init_cfg(struct qs_cfg *cfg, const char *name)
{
    cfg->abi = QS_ABI_VERSION;
    cfg->header_size = (uint32_t)offsetof(struct qs_cfg, cards);
    cfg->cfg_size = sizeof *cfg;
    cfg->state_size = sizeof(struct qs_state);
    snprintf(cfg->name, sizeof cfg->name, "%s", name);
    atomic_thread_fence(memory_order_release);
    cfg->magic = QS_CFG_MAGIC;
}

void qs_segment_unlink(const char *dir, const char *name)
{
    char path[512];
    const char *suffixes[] = {"cfg", "state", "sock"};
    for (size_t i = 0; i < 3; i++)
        if (qs_segment_path(path, sizeof path, dir, name, suffixes[i]) == QS_OK)
            unlink(path);
}

/* The paths of both parts of segment `name`, after checking the name. */
static int part_paths(const char *dir, const char *name, char cpath[512], char spath[512])
{
    int rc = qs_check_name(name);
    if (rc == QS_OK)
        rc = qs_segment_path(cpath, 512, dir, name, "cfg");
    if (rc == QS_OK)
        rc = qs_segment_path(spath, 512, dir, name, "state");
    return rc;
}

int qs_segment_create(const char *dir, const char *name, int replace, struct qs_segment *seg)
{
    char cpath[512], spath[512];
    int rc = part_paths(dir, name, cpath, spath);
    if (rc != QS_OK)
        return rc;
    if (replace)
        qs_segment_unlink(dir, name);
    void *cmap = NULL, *smap = NULL;
    rc = create_file(cpath, sizeof(struct qs_cfg), CFG_MODE, &cmap);
    if (rc != QS_OK)
        return rc;
    rc = create_file(spath, sizeof(struct qs_state), STATE_MODE, &smap);
    if (rc == QS_OK)
        rc = init_state(smap);
    if (rc != QS_OK) {
        munmap(cmap, sizeof(struct qs_cfg));
        if (smap)
            munmap(smap, sizeof(struct qs_state));
        unlink(cpath);
        unlink(spath);
        return rc;
    }
    init_cfg(cmap, name);
    seg->cfg = cmap;
    seg->state = smap;
    seg->writable_cfg = 1;
    return QS_OK;
}

/* Check a part's header before mapping it whole: wrong magic, version or size fail
 * with a clear error and leave everything as it was. */
static int check_header(int fd, const char *path, uint64_t magic, size_t size)
{
    struct { uint64_t magic; uint32_t abi; uint32_t pad; } hdr;
    struct stat sb;
    if (fstat(fd, &sb))
        return qs_fail_errno(path);
    if ((size_t)sb.st_size < sizeof hdr || pread(fd, &hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        return qs_fail(QS_EMAGIC, "%s is too small to be a qshare segment", path);
    if (hdr.magic != magic)
        return qs_fail(QS_EMAGIC, "%s is not a qshare segment (bad magic)", path);
    if (hdr.abi != QS_ABI_VERSION)
        return qs_fail(QS_EVERSION, "%s has ABI version %u; this library speaks %u", path,
                       hdr.abi, QS_ABI_VERSION);
    if ((size_t)sb.st_size != size)
        return qs_fail(QS_ESIZE, "%s is %lld bytes; ABI %u expects %zu", path,
                       (long long)sb.st_size, QS_ABI_VERSION, size);
    return QS_OK;
}

static int map_part(const char *path, uint64_t magic, size_t size, int writable, void **map)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? qs_fail(QS_ENOENT, "no segment at %s", path)
                               : qs_fail_errno(path);
    int rc = check_header(fd, path, magic, size);
    if (rc == QS_OK) {
        *map = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
        if (*map == MAP_FAILED)
            rc = qs_fail_errno("mmap");
    }
    close(fd);
    return rc;
}

int qs_segment_open(const char *dir, const char *name, int writable_cfg, struct qs_segment *seg)
{
    char cpath[512], spath[512];
    int rc = part_paths(dir, name, cpath, spath);
    void *cmap = NULL, *smap = NULL;
    if (rc == QS_OK)
        rc = map_part(cpath, QS_CFG_MAGIC, sizeof(struct qs_cfg), writable_cfg, &cmap);
    if (rc == QS_OK)
        rc = map_part(spath, QS_STATE_MAGIC, sizeof(struct qs_state), 1, &smap);
    if (rc != QS_OK) {
        if (cmap)
            munmap(cmap, sizeof(struct qs_cfg));
        return rc;
    }
    seg->cfg = cmap;
    seg->state = smap;
    seg->writable_cfg = writable_cfg;
    return QS_OK;
}

void qs_segment_unmap(struct qs_segment *seg)
{
    if (seg->cfg)
        munmap(seg->cfg, sizeof(struct qs_cfg));
    if (seg->state)
        munmap(seg->state, sizeof(struct qs_state));
    seg->cfg = NULL;
    seg->state = NULL;
}

int qs_find_vgpu(const struct qs_cfg *cfg, uint32_t id)
{
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++) {
        const struct qs_cfg_vgpu *v = &cfg->vgpus[s];
        if (atomic_load(&v->state) == QS_SLOT_ACTIVE && v->id == id)
            return (int)s;
    }
    return -1;
}
