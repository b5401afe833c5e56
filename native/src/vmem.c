/* vmem.c — each vGPU's memory part: its memory count, lock and per-context reservations in a
 * sealed memfd that the owner passes to that vGPU's processes alone. */
#include "internal.h"

#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int init_vmem(struct qs_vmem *vm, uint32_t slot)
{
    int rc = qs_robust_init(&vm->lock);
    vm->slot = slot;
    vm->abi = QS_ABI_VERSION;
    vm->vmem_size = sizeof *vm;
    atomic_thread_fence(memory_order_release);
    vm->magic = QS_VMEM_MAGIC; /* last: a half-made part never validates */
    return rc;
}

void qs_vmem_drop(struct qs_segment *seg, uint32_t slot)
{
    if (slot >= QS_MAX_VGPUS)
        return;
    if (seg->vmem[slot])
        munmap(seg->vmem[slot], sizeof(struct qs_vmem));
    if (seg->vmem_fd[slot] >= 0)
        close(seg->vmem_fd[slot]);
    seg->vmem[slot] = NULL;
    seg->vmem_fd[slot] = -1;
}

int qs_vmem_new(struct qs_segment *seg, const char *name, uint32_t slot)
{
    char label[QS_NAME_MAX + 32];
    snprintf(label, sizeof label, "qshare.%s.mem%u", name, slot);
    int fd = -1;
    void *map = NULL;
    int rc = qs_memfd_sealed(label, sizeof(struct qs_vmem), &fd, &map);
    if (rc != QS_OK)
        return rc;
    uint64_t ino = 0, dev = 0;
    rc = init_vmem(map, slot);
    if (rc == QS_OK)
        rc = qs_fd_identity(fd, &ino, &dev);
    if (rc != QS_OK) {
        munmap(map, sizeof(struct qs_vmem));
        close(fd);
        return rc;
    }
    qs_vmem_drop(seg, slot);
    seg->vmem[slot] = map;
    seg->vmem_fd[slot] = fd;
    seg->owner->vmem_ino[slot] = ino;
    seg->owner->vmem_dev[slot] = dev;
    return QS_OK;
}

int qs_vmem_map(struct qs_segment *seg, uint32_t slot, int fd)
{
    if (slot >= QS_MAX_VGPUS)
        return qs_fail(QS_ECORRUPT, "vGPU slot %u is out of range", slot);
    void *map = NULL;
    int rc = qs_check_part(fd, "the vGPU's memory part", QS_VMEM_MAGIC, sizeof(struct qs_vmem));
    if (rc == QS_OK) {
        map = mmap(NULL, sizeof(struct qs_vmem), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        rc = map == MAP_FAILED ? qs_fail_errno("mmap") : QS_OK;
    }
    if (rc == QS_OK && ((struct qs_vmem *)map)->slot != slot) {
        rc = qs_fail(QS_ECORRUPT, "the memory part passed is vGPU slot %u's, not %u's",
                     ((struct qs_vmem *)map)->slot, slot);
        munmap(map, sizeof(struct qs_vmem));
    }
    if (rc != QS_OK)
        return rc;
    qs_vmem_drop(seg, slot);
    seg->vmem[slot] = map;
    seg->vmem_fd[slot] = fd;
    return QS_OK;
}

/* Adopt: memory part `fd`, the one the owner made for slot `slot` (its recorded inode, held
 * open by a live process of the vGPU), has a header a tenant rewrote. Write it again (the
 * total to be summed again from the shares, which the tenant may have rewritten too); its size
 * is sealed, so it is the size it was made. */
int qs_vmem_restore_header(int fd, uint32_t slot)
{
    struct stat sb;
    if (fstat(fd, &sb) || (size_t)sb.st_size != sizeof(struct qs_vmem))
        return qs_fail(QS_ESIZE, "vGPU slot %u's memory part is not the size it was made", slot);
    struct qs_vmem *vm = mmap(NULL, sizeof *vm, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (vm == MAP_FAILED)
        return qs_fail_errno("mmap");
    vm->slot = slot;
    vm->abi = QS_ABI_VERSION;
    vm->vmem_size = sizeof *vm;
    __atomic_store_n(&vm->recount, 1, __ATOMIC_SEQ_CST);
    atomic_thread_fence(memory_order_release);
    vm->magic = QS_VMEM_MAGIC;
    munmap(vm, sizeof *vm);
    return QS_OK;
}
