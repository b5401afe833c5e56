/* segment.c — the node segment: a configuration part (a file only the owner can open, 0600;
 * clients get a read-only descriptor over the attach socket), an owner part (0600, the
 * owner's private record of every context, never given to clients) and a state part (a memfd
 * sealed against shrinking and growing, passed to clients; no path opens it). Every part is
 * checked for type, magic, ABI version and size before it is mapped. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PART_MODE 0600
#define STATE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

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

int qs_vgpu_dir_path(char *buf, size_t len, const char *dir, const char *name, uint32_t id)
{
    int n = snprintf(buf, len, "%s/qshare.%s.v%u", qs_default_dir(dir), name, id);
    if (n < 0 || (size_t)n >= len)
        return qs_fail(QS_EINVAL, "segment directory path is too long");
    return QS_OK;
}

int qs_vgpu_sock_path(char *buf, size_t len, const char *dir, const char *name, uint32_t id)
{
    int n = snprintf(buf, len, "%s/qshare.%s.v%u/sock", qs_default_dir(dir), name, id);
    if (n < 0 || (size_t)n >= len)
        return qs_fail(QS_EINVAL, "segment directory path is too long");
    return QS_OK;
}

static int map_fd(int fd, size_t size, int prot, void **map)
{
    *map = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    if (*map == MAP_FAILED) {
        *map = NULL;
        return qs_fail_errno("mmap");
    }
    return QS_OK;
}

static int create_file(const char *path, size_t size, void **map)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, PART_MODE);
    if (fd < 0)
        return errno == EEXIST ? qs_fail(QS_EEXIST, "segment file %s already exists", path)
                               : qs_fail_errno(path);
    int rc = QS_OK;
    if (fchmod(fd, PART_MODE) || ftruncate(fd, (off_t)size))
        rc = qs_fail_errno(path);
    if (rc == QS_OK)
        rc = map_fd(fd, size, PROT_READ | PROT_WRITE, map);
    close(fd);
    if (rc != QS_OK)
        unlink(path);
    return rc;
}

static void init_state(struct qs_state *st)
{
    st->abi = QS_ABI_VERSION;
    st->state_size = sizeof *st;
    atomic_thread_fence(memory_order_release);
    st->magic = QS_STATE_MAGIC; /* last: a half-made segment never validates */
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

static int init_owner(struct qs_owner *own)
{
    int rc = qs_robust_init(&own->seg_lock);
    own->abi = QS_ABI_VERSION;
    own->owner_size = sizeof *own;
    atomic_thread_fence(memory_order_release);
    own->magic = QS_OWNER_MAGIC;
    return rc;
}

void qs_segment_unlink(const char *dir, const char *name)
{
    char path[512];
    const char *suffixes[] = {"cfg", "owner"};
    for (size_t i = 0; i < 2; i++)
        if (qs_segment_path(path, sizeof path, dir, name, suffixes[i]) == QS_OK)
            unlink(path);
}

/* The paths of the cfg and owner parts of segment `name`, after checking the name. */
static int part_paths(const char *dir, const char *name, char cpath[512], char opath[512])
{
    int rc = qs_check_name(name);
    if (rc == QS_OK)
        rc = qs_segment_path(cpath, 512, dir, name, "cfg");
    if (rc == QS_OK)
        rc = qs_segment_path(opath, 512, dir, name, "owner");
    return rc;
}

int qs_memfd_sealed(const char *label, size_t size, int *fd_out, void **map_out)
{
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return qs_fail_errno("memfd_create");
    void *map = NULL;
    int rc = ftruncate(fd, (off_t)size) || fcntl(fd, F_ADD_SEALS, STATE_SEALS)
                 ? qs_fail_errno("sealing a memfd")
                 : map_fd(fd, size, PROT_READ | PROT_WRITE, &map);
    if (rc != QS_OK) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    *map_out = map;
    return QS_OK;
}

int qs_fd_identity(int fd, uint64_t *ino, uint64_t *dev)
{
    struct stat sb;
    if (fstat(fd, &sb))
        return qs_fail_errno("fstat");
    *ino = (uint64_t)sb.st_ino;
    *dev = (uint64_t)sb.st_dev;
    return QS_OK;
}

int qs_segment_new_state(const char *name, struct qs_segment *seg)
{
    char label[QS_NAME_MAX + 16];
    snprintf(label, sizeof label, "qshare.%s.state", name);
    int fd = -1;
    void *map = NULL;
    int rc = qs_memfd_sealed(label, sizeof(struct qs_state), &fd, &map);
    if (rc != QS_OK)
        return rc;
    init_state(map);
    rc = qs_fd_identity(fd, &seg->owner->state_ino, &seg->owner->state_dev);
    if (rc != QS_OK) {
        munmap(map, sizeof(struct qs_state));
        close(fd);
        return rc;
    }
    seg->state = map;
    seg->state_fd = fd;
    return QS_OK;
}

static int open_ro(const char *path, int *out)
{
    *out = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    return *out < 0 ? qs_fail_errno(path) : QS_OK;
}

static void unmap_all(struct qs_segment *seg);

int qs_segment_create(const char *dir, const char *name, int replace, struct qs_segment *seg)
{
    char cpath[512], opath[512];
    int rc = part_paths(dir, name, cpath, opath);
    if (rc != QS_OK)
        return rc;
    if (replace)
        qs_segment_unlink(dir, name);
    qs_segment_init(seg);
    void *cmap = NULL, *omap = NULL;
    rc = create_file(cpath, sizeof(struct qs_cfg), &cmap);
    if (rc != QS_OK)
        return rc;
    rc = create_file(opath, sizeof(struct qs_owner), &omap);
    seg->cfg = cmap;
    seg->owner = omap;
    if (rc == QS_OK)
        rc = init_owner(omap);
    if (rc == QS_OK)
        rc = qs_segment_new_state(name, seg);
    if (rc == QS_OK)
        rc = open_ro(cpath, &seg->cfg_ro_fd);
    if (rc != QS_OK) {
        unmap_all(seg);
        unlink(cpath);
        unlink(opath);
        return rc;
    }
    init_cfg(cmap, name);
    return QS_OK;
}

/* Check a part's type and header before mapping it whole: anything but a regular file (or
 * memfd) of the expected magic, ABI version and size fails with a clear error. */
int qs_check_part(int fd, const char *what, uint64_t magic, size_t size)
{
    struct { uint64_t magic; uint32_t abi; uint32_t pad; } hdr;
    struct stat sb;
    if (fstat(fd, &sb))
        return qs_fail_errno(what);
    if (!S_ISREG(sb.st_mode))
        return qs_fail(QS_EMAGIC, "%s is not a regular file (mode %o): not a qshare segment",
                       what, (unsigned)(sb.st_mode & S_IFMT));
    if ((size_t)sb.st_size < sizeof hdr || pread(fd, &hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        return qs_fail(QS_EMAGIC, "%s is too small to be a qshare segment", what);
    if (hdr.magic != magic)
        return qs_fail(QS_EMAGIC, "%s is not a qshare segment (bad magic)", what);
    if (hdr.abi != QS_ABI_VERSION)
        return qs_fail(QS_EVERSION, "%s has ABI version %u; this library speaks %u", what,
                       hdr.abi, QS_ABI_VERSION);
    if ((size_t)sb.st_size != size)
        return qs_fail(QS_ESIZE, "%s is %lld bytes; ABI %u expects %zu", what,
                       (long long)sb.st_size, QS_ABI_VERSION, size);
    return QS_OK;
}

/* Open a part by path without blocking (a FIFO) or following a link, then check it. */
static int open_part(const char *path, uint64_t magic, size_t size, int writable, int *out)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? qs_fail(QS_ENOENT, "no segment at %s", path)
               : errno == ELOOP ? qs_fail(QS_EMAGIC, "%s is a symbolic link: refused", path)
                                : qs_fail_errno(path);
    int rc = qs_check_part(fd, path, magic, size);
    if (rc != QS_OK) {
        close(fd);
        return rc;
    }
    *out = fd;
    return QS_OK;
}

static int map_part(const char *path, uint64_t magic, size_t size, void **map)
{
    int fd = -1;
    int rc = open_part(path, magic, size, 1, &fd);
    if (rc == QS_OK) {
        rc = map_fd(fd, size, PROT_READ | PROT_WRITE, map);
        close(fd);
    }
    return rc;
}

int qs_segment_open_owner(const char *dir, const char *name, struct qs_segment *seg)
{
    char cpath[512], opath[512];
    qs_segment_init(seg);
    int rc = part_paths(dir, name, cpath, opath);
    void *cmap = NULL, *omap = NULL;
    if (rc == QS_OK)
        rc = map_part(cpath, QS_CFG_MAGIC, sizeof(struct qs_cfg), &cmap);
    seg->cfg = cmap;
    if (rc == QS_OK)
        rc = map_part(opath, QS_OWNER_MAGIC, sizeof(struct qs_owner), &omap);
    seg->owner = omap;
    if (rc == QS_OK)
        rc = open_part(cpath, QS_CFG_MAGIC, sizeof(struct qs_cfg), 0, &seg->cfg_ro_fd);
    if (rc != QS_OK)
        unmap_all(seg);
    return rc;
}

int qs_segment_map_state(int fd, struct qs_segment *seg)
{
    void *map = NULL;
    int rc = qs_check_part(fd, "the state part", QS_STATE_MAGIC, sizeof(struct qs_state));
    if (rc == QS_OK)
        rc = map_fd(fd, sizeof(struct qs_state), PROT_READ | PROT_WRITE, &map);
    if (rc != QS_OK)
        return rc;
    seg->state = map;
    seg->state_fd = fd;
    return QS_OK;
}

int qs_segment_map_client(const int fds[QS_ATTACH_FDS], uint32_t vslot, struct qs_segment *seg)
{
    qs_segment_init(seg);
    void *cmap = NULL;
    int rc = qs_check_part(fds[0], "the cfg part", QS_CFG_MAGIC, sizeof(struct qs_cfg));
    if (rc == QS_OK)
        rc = map_fd(fds[0], sizeof(struct qs_cfg), PROT_READ, &cmap);
    seg->cfg = cmap;
    if (rc == QS_OK)
        rc = qs_segment_map_state(fds[1], seg);
    if (rc == QS_OK)
        rc = qs_vmem_map(seg, vslot, fds[2]);
    if (rc != QS_OK) { /* unmap, but leave every descriptor to the caller */
        seg->state_fd = -1;
        seg->vmem_fd[vslot < QS_MAX_VGPUS ? vslot : 0] = -1;
        unmap_all(seg);
        return rc;
    }
    close(fds[0]);
    return QS_OK;
}

void qs_segment_init(struct qs_segment *seg)
{
    *seg = (struct qs_segment){.state_fd = -1, .cfg_ro_fd = -1};
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        seg->vmem_fd[s] = -1;
}

static void unmap_all(struct qs_segment *seg)
{
    for (uint32_t s = 0; s < QS_MAX_VGPUS; s++)
        qs_vmem_drop(seg, s);
    if (seg->cfg)
        munmap(seg->cfg, sizeof(struct qs_cfg));
    if (seg->state)
        munmap(seg->state, sizeof(struct qs_state));
    if (seg->owner)
        munmap(seg->owner, sizeof(struct qs_owner));
    if (seg->state_fd >= 0)
        close(seg->state_fd);
    if (seg->cfg_ro_fd >= 0)
        close(seg->cfg_ro_fd);
    qs_segment_init(seg);
}

void qs_segment_unmap(struct qs_segment *seg)
{
    unmap_all(seg);
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
