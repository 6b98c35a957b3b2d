/*
 * Out-of-core BFS over a CSR graph file through UMap's umap(), the shape of
 * UMap's own BFS benchmark: level-synchronous and top-down, each level scans
 * every vertex and expands those on it (uint16_t levels, plain stores).
 *
 *   bfs_umap GRAPH [--mmap | --compare] [--threads N] [--source S] [--reps R]
 *
 * GRAPH is headerless CSR as `faultline graph gen` writes it: u64 index[n+1]
 * (index[0] = 0, index[n] = m), then u64 edges[m]. --mmap maps it with the
 * kernel's mmap(MAP_PRIVATE) instead; --compare runs both, alternating, R
 * times each (fresh mapping every run), and prints the medians and the
 * ratio. Build: cc -O2 bfs_umap.c $(pkg-config --cflags --libs umap) -lpthread
 */
#include <umap/umap.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define UNREACHED 0xFFFFu
#define CHUNK 4096

struct graph {
    uint64_t n, m;
    const uint64_t *index, *edges;
};

struct search {
    struct graph g;
    uint16_t *level;
    uint16_t cur;
    uint64_t next_chunk;
    int found, done;
    pthread_barrier_t barrier;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* n is the only k with index[k] == words - k - 1 in the non-decreasing
 * prefix; read with pread so the mapping under test stays cold. */
static int infer_vertices(int fd, uint64_t words, uint64_t *n) {
    enum { BUF = 1 << 17 };
    uint64_t *buf = malloc(BUF * sizeof *buf), prev = 0;
    for (uint64_t k = 0; k < words;) {
        ssize_t got = pread(fd, buf, BUF * sizeof *buf, (off_t)(k * 8));
        if (got <= 0) break;
        for (uint64_t i = 0; i < (uint64_t)got / 8 && k < words; i++, k++) {
            if (buf[i] < prev) goto bad;
            prev = buf[i];
            if (buf[i] == words - k - 1) {
                *n = k;
                free(buf);
                return 0;
            }
        }
    }
bad:
    free(buf);
    return -1;
}

static void *worker(void *arg) {
    struct search *s = arg;
    const uint64_t n = s->g.n;
    const uint64_t *restrict index = s->g.index, *restrict edges = s->g.edges;
    uint16_t *level = s->level;
    for (;;) {
        pthread_barrier_wait(&s->barrier);
        if (s->done) return NULL;
        const uint16_t cur = s->cur, next = (uint16_t)(cur + 1);
        int found = 0;
        for (;;) {
            uint64_t start = __atomic_fetch_add(&s->next_chunk, CHUNK, __ATOMIC_RELAXED);
            if (start >= n) break;
            uint64_t end = start + CHUNK < n ? start + CHUNK : n;
            for (uint64_t v = start; v < end; v++) {
                if (__atomic_load_n(&level[v], __ATOMIC_RELAXED) != cur) continue;
                for (uint64_t e = index[v], last = index[v + 1]; e < last; e++) {
                    uint64_t w = edges[e];
                    if (__atomic_load_n(&level[w], __ATOMIC_RELAXED) == UNREACHED) {
                        __atomic_store_n(&level[w], next, __ATOMIC_RELAXED);
                        found = 1;
                    }
                }
            }
        }
        if (found) __atomic_store_n(&s->found, 1, __ATOMIC_RELAXED);
        pthread_barrier_wait(&s->barrier);
    }
}

/* One search; returns seconds, fills the per-level counts. */
static double bfs(struct graph g, uint64_t source, int threads, uint16_t *level,
                  uint64_t *reached, int *levels) {
    struct search s = {.g = g, .level = level};
    for (uint64_t v = 0; v < g.n; v++) level[v] = UNREACHED;
    level[source] = 0;
    pthread_barrier_init(&s.barrier, NULL, (unsigned)threads + 1);
    pthread_t *t = malloc(sizeof *t * (size_t)threads);
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, &s);
    for (s.cur = 0;; s.cur++) {
        s.next_chunk = 0;
        s.found = 0;
        pthread_barrier_wait(&s.barrier); /* start the level */
        pthread_barrier_wait(&s.barrier); /* its end */
        if (!s.found || s.cur == UNREACHED - 2) break;
    }
    s.done = 1;
    pthread_barrier_wait(&s.barrier);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double secs = now() - t0;
    pthread_barrier_destroy(&s.barrier);
    free(t);
    *reached = 0;
    for (uint64_t v = 0; v < g.n; v++) *reached += level[v] != UNREACHED;
    *levels = s.cur + 1;
    return secs;
}

static double run(const char *path, int use_mmap, uint64_t source, int threads, uint16_t *level,
                  uint64_t *reached, int *levels) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); exit(1); }
    struct stat st;
    fstat(fd, &st);
    size_t len = (size_t)st.st_size, mapped = (len + 4095) & ~(size_t)4095;
    uint64_t words = len / 8, n;
    if (len % 8 || infer_vertices(fd, words, &n) < 0) {
        fprintf(stderr, "%s: not a CSR graph file\n", path);
        exit(1);
    }
    void *p = use_mmap ? mmap(NULL, mapped, PROT_READ, MAP_PRIVATE, fd, 0)
                       : umap(NULL, mapped, PROT_READ, UMAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED || p == UMAP_FAILED) {
        fprintf(stderr, "%s: %s\n", use_mmap ? "mmap" : "umap", strerror(errno));
        exit(1);
    }
    struct graph g = {n, words - n - 1, p, (const uint64_t *)p + n + 1};
    if (source >= n) { fprintf(stderr, "source %lu >= %lu vertices\n", (unsigned long)source, (unsigned long)n); exit(1); }
    double secs = bfs(g, source, threads, level, reached, levels);
    if (use_mmap) munmap(p, mapped);
    else if (uunmap(p, mapped) != 0) { perror("uunmap"); exit(1); }
    close(fd);
    return secs;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int use_mmap = 0, compare = 0, threads = 2, reps = 3;
    uint64_t source = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mmap")) use_mmap = 1;
        else if (!strcmp(argv[i], "--compare")) compare = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--source") && i + 1 < argc) source = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else { fprintf(stderr, "usage: %s GRAPH [--mmap|--compare] [--threads N] [--source S] [--reps R]\n", argv[0]); return 2; }
    }
    if (!path || threads < 1 || reps < 1) { fprintf(stderr, "usage: %s GRAPH ...\n", argv[0]); return 2; }
    struct stat st;
    if (stat(path, &st) != 0) { perror(path); return 1; }
    uint16_t *level = malloc(st.st_size / 8 * sizeof *level), *check = NULL;
    uint64_t reached, reached0 = 0;
    int levels, levels0 = 0;
    if (!compare) {
        double s = run(path, use_mmap, source, threads, level, &reached, &levels);
        printf("bfs %s: %d levels, %lu vertices reached, %.4f s\n", use_mmap ? "mmap" : "umap",
               levels, (unsigned long)reached, s);
        return 0;
    }
    double *t_mmap = malloc(sizeof(double) * reps), *t_umap = malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; r++) {
        t_mmap[r] = run(path, 1, source, threads, level, &reached0, &levels0);
        if (!check) {
            check = malloc(st.st_size / 8 * sizeof *check);
            memcpy(check, level, st.st_size / 8 * sizeof *check);
        }
        t_umap[r] = run(path, 0, source, threads, level, &reached, &levels);
        if (reached != reached0 || levels != levels0 ||
            memcmp(check, level, st.st_size / 8 * sizeof *level) != 0) {
            fprintf(stderr, "umap and mmap disagree: %lu/%d vs %lu/%d\n", (unsigned long)reached,
                    levels, (unsigned long)reached0, levels0);
            return 1;
        }
        printf("rep %d: mmap %.4f s, umap %.4f s\n", r, t_mmap[r], t_umap[r]);
    }
    qsort(t_mmap, (size_t)reps, sizeof(double), cmp);
    qsort(t_umap, (size_t)reps, sizeof(double), cmp);
    double mm = t_mmap[reps / 2], um = t_umap[reps / 2];
    printf("bfs: %d levels, %lu vertices reached, %d threads\n", levels, (unsigned long)reached, threads);
    printf("median mmap %.4f s, umap %.4f s, umap/mmap %.2fx\n", mm, um, um / mm);
    return 0;
}
