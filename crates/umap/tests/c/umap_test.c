/* UMap's C API on libumap; run by tests/umap_c.rs.
 * usage: umap_test MODE [FILE]; prints "ok MODE" on success. */
#include <umap/umap.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d: %s)\n", __FILE__,       \
                    __LINE__, #cond, errno, strerror(errno));                           \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

enum { PAGE = 4096 };

static off_t file_size(int fd) { return lseek(fd, 0, SEEK_END); }

/* System pages of [p, p + len) that are resident. */
static size_t resident(void *p, size_t len) {
    size_t n = len / PAGE, count = 0;
    unsigned char *vec = malloc(n);
    CHECK(mincore(p, len, vec) == 0);
    for (size_t i = 0; i < n; i++) count += vec[i] & 1;
    free(vec);
    return count;
}

static int threads_now(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int readback(const char *path) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd);
    unsigned char *want = malloc(len);
    CHECK(pread(fd, want, len, 0) == (ssize_t)len);
    unsigned char *p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    CHECK(memcmp(p, want, len) == 0);
    CHECK(uunmap(p, len) == 0);
    close(fd);
    free(want);
    return 0;
}

static int writeback(const char *path) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd);
    unsigned char *p = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    for (size_t i = 0; i < len; i += PAGE) p[i + 9] = (unsigned char)(i / PAGE + 1);
    CHECK(umap_flush() == 0);
    for (size_t i = 0; i < len; i += PAGE) {
        unsigned char b;
        CHECK(pread(fd, &b, 1, (off_t)i + 9) == 1 && b == (unsigned char)(i / PAGE + 1));
    }
    for (size_t i = 0; i < len; i += PAGE) p[i + 10] = 0xEE;
    CHECK(uunmap(p, len) == 0);
    for (size_t i = 0; i < len; i += PAGE) {
        unsigned char b;
        CHECK(pread(fd, &b, 1, (off_t)i + 10) == 1 && b == 0xEE);
    }
    close(fd);
    /* A read-only descriptor maps, but cannot take writes back. */
    fd = open(path, O_RDONLY);
    p = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    p[0] = 0x11;
    errno = 0;
    CHECK(umap_flush() == -1 && errno == EBADF);
    CHECK(uunmap(p, len) == -1 && errno == EBADF);
    close(fd);
    return 0;
}

/* Prints the configuration and what it did, for the test to compare. */
static int config(const char *path) {
    printf("page_size %lu\n", (unsigned long)umapcfg_get_umap_page_size());
    printf("buf_pages %lu\n", (unsigned long)umapcfg_get_max_pages_in_buffer());
    printf("fillers %lu\n", (unsigned long)umapcfg_get_num_fillers());
    printf("evictors %lu\n", (unsigned long)umapcfg_get_num_evictors());
    printf("read_ahead %lu\n", (unsigned long)umapcfg_get_read_ahead());
    printf("max_fault_events %lu\n", (unsigned long)umapcfg_get_max_fault_events());
    printf("high %d\nlow %d\n", umapcfg_get_evict_high_water_threshold(),
           umapcfg_get_evict_low_water_threshold());
    printf("system_page %ld\n", umapcfg_get_system_page_size());
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd);
    int before = threads_now();
    unsigned char *p = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    if (p == UMAP_FAILED) {
        printf("umap_errno %d\n", errno);
        printf("ok config\n");
        return 0;
    }
    volatile unsigned char sink = p[0]; /* one read fault */
    (void)sink;
    printf("threads_added %d\n", threads_now() - before);
    printf("resident_after_one_fault %zu\n", resident(p, len));
    /* Sweep every page, then give the evictor a moment to settle. */
    unsigned long sum = 0;
    for (size_t i = 0; i < len; i += PAGE) sum += p[i];
    size_t r = resident(p, len);
    for (int i = 0; i < 200; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        size_t now = resident(p, len);
        if (now == r) break;
        r = now;
    }
    printf("resident_after_sweep %zu\n", r);
    printf("sum %lu\n", sum);
    CHECK(uunmap(p, len) == 0);
    printf("ok config\n");
    return 0;
}

/* umap_prefetch of an address inside the second system page: prints how
 * many system pages became resident (the whole UMap page holding it). */
static int prefetch(const char *path) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd);
    unsigned char *p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    struct umap_prefetch_item item = {p + PAGE + 7};
    umap_prefetch(1, &item);
    printf("resident_after_prefetch %zu\n", resident(p, len));
    CHECK(uunmap(p, len) == 0);
    close(fd);
    return 0;
}

/* Resident pages of [p, p + len) and, unless q is NULL, of [q, q + len). */
static size_t resident_both(void *p, void *q, size_t len) {
    return resident(p, len) + (q ? resident(q, len) : 0);
}

/* Waits (at most 10 s) until at most `want` pages of [p, p + len) and
 * [q, q + len) together (q may be NULL) are resident; returns the count
 * last seen. */
static size_t wait_both_at_most(void *p, void *q, size_t len, size_t want) {
    size_t r = resident_both(p, q, len);
    for (int i = 0; i < 10000 && r > want; i++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
        r = resident_both(p, q, len);
    }
    return r;
}

static size_t wait_resident_at_most(void *p, size_t len, size_t want) {
    return wait_both_at_most(p, NULL, len, want);
}

/* Opens `path` (at least 64 pages) read-only; `*want` gets its bytes. */
static int open_read_only_64(const char *path, size_t *len, unsigned char **want) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    *len = (size_t)file_size(fd);
    CHECK(*len / PAGE >= 64);
    *want = malloc(*len);
    CHECK(pread(fd, *want, *len, 0) == (ssize_t)*len);
    return fd;
}

/* Run with UMAP_BUFSIZE=20, HIGH=80 (16 pages), LOW=30 (6 pages),
 * READ_AHEAD=0 on a file of at least 64 pages. */
static int watermarks(const char *path) {
    CHECK(umapcfg_get_max_pages_in_buffer() == 20);
    size_t len;
    unsigned char *want;
    int fd = open_read_only_64(path, &len, &want);
    size_t pages = len / PAGE;

    /* Low water: the 16th page reaches the high-water mark and wakes the
     * evictor, which stops at 6 (BUFSIZE * LOW / 100), not just under it.
     * With fillers (handler threads that read the region's events) the
     * 16th page can land after the drain: its copy fails with EAGAIN
     * while a REMOVE of the drain's own zaps is pending, gives its charge
     * back and is retried, so the drain may reach 6 without it: 7. */
    unsigned char *p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    for (size_t i = 0; i < 16; i++) CHECK(p[i * PAGE] == want[i * PAGE]);
    size_t most = getenv("UMAP_PAGE_FILLERS") ? 7 : 6;
    size_t r = wait_resident_at_most(p, len, most);
    printf("drained_to %zu\n", r);
    CHECK(r >= 6 && r <= most);
    /* Prefetched pages are installed clean, as a read installs them: the
     * read-only fd takes no write-back at uunmap (which would fail EBADF). */
    struct umap_prefetch_item item = {p + 40 * PAGE};
    umap_prefetch(1, &item);
    CHECK(resident(p + 40 * PAGE, PAGE) == 1);
    CHECK(uunmap(p, len) == 0);

    /* umap_fetch_and_pin: the 8 pinned pages are resident at once and
     * stay resident (with the right bytes) through a sweep of every other
     * page, under a buffer of 20 that evicts everything else. */
    p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    umap_fetch_and_pin((char *)p, 8 * PAGE);
    CHECK(resident(p, 8 * PAGE) == 8);
    for (int round = 0; round < 2; round++)
        for (size_t i = 8; i < pages; i++) CHECK(p[i * PAGE + 1] == want[i * PAGE + 1]);
    r = wait_resident_at_most(p, len, 16);
    printf("pinned_resident %zu of 8, region resident %zu\n", resident(p, 8 * PAGE), r);
    CHECK(r <= 16);
    CHECK(resident(p, 8 * PAGE) == 8);
    CHECK(memcmp(p, want, 8 * PAGE) == 0);
    /* Outside every region: EINVAL. */
    errno = 0;
    umap_fetch_and_pin((char *)want, PAGE);
    CHECK(errno == EINVAL);
    CHECK(uunmap(p, len) == 0);
    close(fd);
    free(want);
    return 0;
}

/* UMap's one buffer for all regions. Run with UMAP_BUFSIZE=32, HIGH=50
 * and LOW=50 (the evictors keep every region together at 16 pages),
 * READ_AHEAD=0, on a file of at least 64 pages. */
static int buffer(const char *path) {
    size_t len;
    unsigned char *want;
    int fd = open_read_only_64(path, &len, &want);
    size_t pages = len / PAGE;
    unsigned char *p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    unsigned char *q = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED && q != UMAP_FAILED);
    /* 12 pages in each: each alone is under 16, together they are not. */
    for (size_t i = 0; i < 12; i++) CHECK(p[i * PAGE] == want[i * PAGE]);
    for (size_t i = 0; i < 12; i++) CHECK(q[i * PAGE + 2] == want[i * PAGE + 2]);
    size_t r = wait_both_at_most(p, q, len, 16);
    printf("two_regions_12_each %zu\n", r);
    CHECK(r <= 16);
    /* Both swept whole, interleaved: still one buffer of 16. */
    for (size_t i = 0; i < pages; i++) {
        CHECK(p[i * PAGE + 3] == want[i * PAGE + 3]);
        CHECK(q[i * PAGE + 4] == want[i * PAGE + 4]);
    }
    r = wait_both_at_most(p, q, len, 16);
    printf("two_regions_swept %zu\n", r);
    CHECK(r <= 16);
    /* Once q is gone its pages no longer count: p alone holds 16. */
    CHECK(uunmap(q, len) == 0);
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < 16; i++) CHECK(p[i * PAGE + 5] == want[i * PAGE + 5]);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    r = resident(p, len);
    printf("after_uunmap %zu\n", r);
    CHECK(r == 16);
    CHECK(uunmap(p, len) == 0);
    close(fd);
    free(want);
    return 0;
}

static int bad_inputs(const char *path) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    errno = 0;
    CHECK(umap(NULL, 16 * PAGE, PROT_READ, UMAP_PRIVATE, -1, 0) == UMAP_FAILED && errno == EBADF);
    errno = 0;
    CHECK(umap(NULL, 16 * PAGE, PROT_READ, UMAP_PRIVATE, 1000, 0) == UMAP_FAILED && errno == EBADF);
    errno = 0;
    CHECK(umap(NULL, 0, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED && errno == EINVAL);
    errno = 0;
    CHECK(umap(NULL, PAGE + 1, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED && errno == EINVAL);
    errno = 0;
    CHECK(umap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0) == UMAP_FAILED && errno == EINVAL);
    errno = 0;
    CHECK(umap(NULL, PAGE, PROT_READ, UMAP_PRIVATE, fd, 100) == UMAP_FAILED && errno == EINVAL);
    errno = 0;
    CHECK(umap(NULL, PAGE, PROT_EXEC, UMAP_PRIVATE, fd, 0) == UMAP_FAILED && errno == EINVAL);
    int wo = open(path, O_WRONLY);
    errno = 0;
    CHECK(umap(NULL, PAGE, PROT_READ, UMAP_PRIVATE, wo, 0) == UMAP_FAILED && errno == EBADF);
    close(wo);
    char x;
    errno = 0;
    CHECK(uunmap(&x, PAGE) == -1 && errno == EINVAL);
    /* UMAP_FIXED over an existing region. */
    unsigned char *p = umap(NULL, 16 * PAGE, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    errno = 0;
    CHECK(umap(p + PAGE, PAGE, PROT_READ, UMAP_PRIVATE | UMAP_FIXED, fd, 0) == UMAP_FAILED && errno != 0);
    struct umap_prefetch_item items[2] = {{p + 3 * PAGE}, {p + 7 * PAGE + 5}};
    umap_prefetch(2, items);
    CHECK(resident(p + 3 * PAGE, PAGE) == 1 && resident(p + 7 * PAGE, PAGE) == 1);
    CHECK(uunmap(p, 16 * PAGE) == 0);
    CHECK(umap_has_write_support() == 1);
    close(fd);
    return 0;
}

struct worker { unsigned char *p, *want; size_t len; int id, n; int bad; };

static void *hammer(void *arg) {
    struct worker *w = arg;
    size_t pages = w->len / PAGE;
    for (size_t k = 0; k < pages; k++) {
        size_t pg = (k * 7919 + (size_t)w->id * 104729) % pages; /* scattered, overlapping */
        size_t off = pg * PAGE + (size_t)w->id * 13;
        if (w->p[off] != w->want[off]) w->bad++;
    }
    return NULL;
}

static int threads(const char *path) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd);
    unsigned char *want = malloc(len);
    CHECK(pread(fd, want, len, 0) == (ssize_t)len);
    unsigned char *p = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    enum { N = 8 };
    pthread_t t[N];
    struct worker w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (struct worker){p, want, len, i, N, 0};
        CHECK(pthread_create(&t[i], NULL, hammer, &w[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(w[i].bad == 0);
    }
    CHECK(memcmp(p, want, len) == 0);
    CHECK(uunmap(p, len) == 0);
    free(want);
    close(fd);
    return 0;
}

/* Checks that the file `fd` holds `len` bytes equal to `want`. */
static void expect_file(int fd, const unsigned char *want, size_t len) {
    unsigned char *got = malloc(len);
    CHECK(pread(fd, got, len, 0) == (ssize_t)len);
    CHECK(memcmp(got, want, len) == 0);
    free(got);
}

/* Deterministic bytes of the direct-I/O file. */
static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + i / PAGE * 7 + 1); }

/* The file as UMap's programs open it: O_RDWR | O_DIRECT. Reads it back
 * byte for byte through umap(), writes every page, flushes, checks the
 * writes with pread on a buffered descriptor, then writes again and
 * checks what uunmap wrote back. Creates `path` (64 pages) itself. */
static int direct(const char *path) {
    enum { PAGES = 64 };
    size_t len = PAGES * PAGE;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    unsigned char *want = malloc(len);
    for (size_t i = 0; i < len; i++) want[i] = pattern(i);
    CHECK(pwrite(fd, want, len, 0) == (ssize_t)len);
    CHECK(fsync(fd) == 0);
    /* Out of the page cache: the first reads come from the disk (with
     * 64 KiB pages, the default store reads them with O_DIRECT). */
    CHECK(posix_fadvise(fd, 0, len, POSIX_FADV_DONTNEED) == 0);
    close(fd);
    int dfd = open(path, O_RDWR | O_DIRECT);
    if (dfd < 0 && errno == EINVAL) {
        printf("skip direct: %s refuses O_DIRECT\n", path);
        printf("ok direct\n");
        exit(0);
    }
    CHECK(dfd >= 0);
    CHECK((fcntl(dfd, F_GETFL) & O_DIRECT) != 0);
    unsigned char *p = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, dfd, 0);
    CHECK(p != UMAP_FAILED);
    for (size_t i = 0; i < len; i++) {
        if (p[i] != want[i]) {
            fprintf(stderr, "byte %zu: %d != %d\n", i, p[i], want[i]);
            exit(1);
        }
    }
    for (size_t pg = 0; pg < PAGES; pg++) {
        p[pg * PAGE + 100] = (unsigned char)(0xA0 + pg);
        want[pg * PAGE + 100] = (unsigned char)(0xA0 + pg);
    }
    CHECK(umap_flush() == 0);
    int bfd = open(path, O_RDONLY);
    CHECK(bfd >= 0);
    expect_file(bfd, want, len);
    for (size_t pg = 0; pg < PAGES; pg += 3) {
        p[pg * PAGE + 4095] = 0x5A;
        want[pg * PAGE + 4095] = 0x5A;
    }
    CHECK(uunmap(p, len) == 0);
    expect_file(bfd, want, len);
    close(bfd);
    close(dfd);
    free(want);
    return 0;
}

/* A second thread's samples of the resident pages. mincore walks the
 * range while pages come and go, so a walk racing with an install ahead
 * of it and an eviction behind it counts both: the sampler asks the
 * sweeping thread to hold still between two accesses (no fault in
 * flight; evictors may still remove pages, which can only lower the
 * count) and samples then. */
struct sampler {
    unsigned char *p;
    size_t len;
    atomic_int stop, want_pause, paused;
    size_t max, samples;
};

/* The waits yield: on one CPU (a taskset) the thread waited for must run
 * for the wait to end, and a wait spinning out its time slice left the
 * sweep too few samples. */
static void *sample_resident(void *arg) {
    struct sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        atomic_store(&s->want_pause, 1);
        while (!atomic_load(&s->paused) && !atomic_load(&s->stop)) sched_yield();
        size_t r = resident(s->p, s->len);
        atomic_store(&s->want_pause, 0);
        while (atomic_load(&s->paused) && !atomic_load(&s->stop)) sched_yield();
        if (r > s->max) s->max = r;
        s->samples++;
    }
    return NULL;
}

/* The sweeping thread's side: holds still while the sampler samples. */
static void hold_still(struct sampler *s) {
    if (!atomic_load(&s->want_pause)) return;
    atomic_store(&s->paused, 1);
    while (atomic_load(&s->want_pause)) sched_yield();
    atomic_store(&s->paused, 0);
}

/* UMAP_BUFSIZE is a bound: a second thread samples the region's resident
 * pages (mincore) throughout a shuffled write sweep and a shuffled read
 * sweep (checking every byte), on the signal engine or with fillers.
 * Prints the largest count seen. */
static int bound(const char *path) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    size_t len = (size_t)file_size(fd), pages = len / PAGE;
    size_t buf = umapcfg_get_max_pages_in_buffer();
    unsigned char *want = malloc(len);
    CHECK(pread(fd, want, len, 0) == (ssize_t)len);
    size_t *order = malloc(pages * sizeof *order);
    for (size_t i = 0; i < pages; i++) order[i] = i;
    srand(7);
    for (size_t i = pages - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    unsigned char *p = umap(NULL, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED);
    struct sampler s = {.p = p, .len = len};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sample_resident, &s) == 0);
    for (size_t k = 0; k < pages; k++) {
        size_t pg = order[k];
        hold_still(&s);
        p[pg * PAGE + 17] = (unsigned char)(pg * 3 + 1);
        want[pg * PAGE + 17] = (unsigned char)(pg * 3 + 1);
    }
    for (size_t k = pages; k-- > 0;) {
        size_t pg = order[k];
        hold_still(&s);
        CHECK(memcmp(p + pg * PAGE, want + pg * PAGE, PAGE) == 0);
    }
    atomic_store(&s.stop, 1);
    CHECK(pthread_join(t, NULL) == 0);
    printf("buffer %zu pages, most resident seen %zu in %zu samples\n", buf, s.max, s.samples);
    CHECK(s.samples > 10);
    CHECK(s.max <= buf);
    CHECK(uunmap(p, len) == 0);
    /* Everything written reached the file. */
    expect_file(fd, want, len);
    close(fd);
    free(want);
    free(order);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1], *path = argv[2];
    int rc = 2;
    if (!strcmp(mode, "readback")) rc = readback(path);
    else if (!strcmp(mode, "writeback")) rc = writeback(path);
    else if (!strcmp(mode, "config")) return config(path);
    else if (!strcmp(mode, "bad-inputs")) rc = bad_inputs(path);
    else if (!strcmp(mode, "threads")) rc = threads(path);
    else if (!strcmp(mode, "watermarks")) rc = watermarks(path);
    else if (!strcmp(mode, "buffer")) rc = buffer(path);
    else if (!strcmp(mode, "prefetch")) rc = prefetch(path);
    else if (!strcmp(mode, "direct")) rc = direct(path);
    else if (!strcmp(mode, "bound")) rc = bound(path);
    if (rc == 0) printf("ok %s\n", mode);
    return rc;
}
