/* The floor of any signal-based watchpoint on this machine: a write to a
 * protected page, the kernel delivers the signal, the handler does nothing
 * but step RIP over the (known, 3-byte) store, and returns. No lookup, no
 * store, no re-protect: whatever a watchpoint library does costs more.
 *
 * Two protections: mprotect(PROT_READ) + SIGSEGV, and userfaultfd
 * write-protect in SIGBUS mode. Prints key=value medians (TSC cycles).
 *   cc -O2 floor.c -o floor && ./floor 20000
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#include <x86intrin.h>

#ifndef UFFD_FEATURE_SIGBUS
#define UFFD_FEATURE_SIGBUS (1 << 7)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif

static void skip_store(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)si;
    ((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP] += 3; /* c6 07 01: movb $1,(%rdi) */
}

static inline void store(char *p) {
    __asm__ volatile(".byte 0xc6, 0x07, 0x01" : : "D"(p) : "memory");
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t run(char *p, int n) {
    uint64_t *s = malloc(sizeof(uint64_t) * n);
    for (int i = 0; i < n; i++) {
        unsigned aux;
        uint64_t t0 = __rdtscp(&aux);
        store(p + (i % 4000));
        uint64_t t1 = __rdtscp(&aux);
        s[i] = t1 - t0;
    }
    qsort(s, n, sizeof(uint64_t), cmp);
    uint64_t m = s[n / 2];
    free(s);
    return m;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = skip_store;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);

    char *a = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    a[0] = 1;
    mprotect(a, 4096, PROT_READ);
    printf("segv.total=%llu\n", (unsigned long long)run(a, n));

    char *b = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    b[0] = 1;
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC);
    if (fd < 0) {
        perror("userfaultfd");
        return 0;
    }
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_SIGBUS};
    struct uffdio_register reg = {.range = {(uintptr_t)b, 4096}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)b, 4096}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(fd, UFFDIO_API, &api) || ioctl(fd, UFFDIO_REGISTER, &reg) ||
        ioctl(fd, UFFDIO_WRITEPROTECT, &wp)) {
        perror("uffd setup");
        return 0;
    }
    printf("uffd.total=%llu\n", (unsigned long long)run(b, n));
    return 0;
}
