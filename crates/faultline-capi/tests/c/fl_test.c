/* Exercises libfaultline through its header; run by tests/c_abi.rs.
 * usage: fl_test MODE [FILE]; prints "ok MODE" and exits 0 on success. */
#include <faultline/faultline.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n",        \
                    __FILE__, __LINE__, #cond, fl_last_error());                 \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

enum { PAGE = 4096 };

static fl_engine *engine(uint32_t kind) {
    fl_engine_options o;
    fl_engine_options_default(&o);
    o.kind = kind;
    o.workers = 2;
    fl_engine *e = NULL;
    CHECK(fl_engine_new(&o, &e) == 0 && e != NULL);
    return e;
}

static unsigned char pattern(uint64_t off) { return (unsigned char)(off * 7 + off / PAGE); }

/* A file of n pages is mapped and read back byte for byte. */
static int file_readback(const char *path) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    off_t len = lseek(fd, 0, SEEK_END);
    unsigned char *want = malloc(len);
    CHECK(pread(fd, want, len, 0) == len);
    close(fd);
    fl_engine *e = engine(FL_ENGINE_SIGNAL);
    fl_store *s = NULL;
    CHECK(fl_store_file(path, 0, &s) == 0);
    fl_region *r = NULL;
    CHECK(fl_region_new(e, (size_t)len, s, NULL, &r) == 0);
    fl_store_free(s); /* the region keeps both alive */
    fl_engine_free(e);
    CHECK(fl_region_is_resident(r, 0, PAGE) == 0);
    CHECK(memcmp(fl_region_addr(r), want, len) == 0);
    CHECK(fl_region_is_resident(r, 0, (size_t)len) == 1);
    fl_region_stats st;
    CHECK(fl_region_get_stats(r, &st) == 0);
    CHECK(st.faults > 0 && st.installed == (uint64_t)len / PAGE && st.resident == st.installed);
    CHECK(fl_region_page_state(r, 0) == FL_PAGE_READ_ONLY || fl_region_page_state(r, 0) == FL_PAGE_WRITABLE);
    CHECK(fl_region_page_state(r, (size_t)len / PAGE) == -EINVAL);
    CHECK(fl_region_free(r) == 0);
    free(want);
    return 0;
}

/* Writes to a budget region over a file, flush, free: the file holds them. */
static int file_writeback(const char *path) {
    fl_engine *e = engine(FL_ENGINE_SIGNAL);
    fl_store *s = NULL;
    CHECK(fl_store_file(path, 0, &s) == 0);
    fl_region_options o;
    fl_region_options_default(&o);
    o.budget_pages = 8;
    o.fault_around = 1;
    fl_region *r = NULL;
    CHECK(fl_region_new(e, 64 * PAGE, s, &o, &r) == 0);
    unsigned char *p = fl_region_addr(r);
    for (int i = 0; i < 64; i++) p[i * PAGE + 5] = (unsigned char)(0xA0 + i);
    CHECK(fl_region_flush(r) >= 0);
    fl_region_stats st;
    CHECK(fl_region_get_stats(r, &st) == 0);
    CHECK(st.max_resident <= 8 + 16 && st.evicted > 0);
    for (int i = 0; i < 64; i++) CHECK(p[i * PAGE + 5] == (unsigned char)(0xA0 + i));
    CHECK(fl_region_free(r) == 0);
    fl_store_free(s);
    fl_engine_free(e);
    int fd = open(path, O_RDONLY);
    for (int i = 0; i < 64; i++) {
        unsigned char b;
        CHECK(pread(fd, &b, 1, (off_t)i * PAGE + 5) == 1 && b == (unsigned char)(0xA0 + i));
    }
    close(fd);
    return 0;
}

/* A store made of callbacks, with a user pointer. */
struct cb_state {
    unsigned char *data;
    size_t len;
    int fills, write_backs, destroyed, fail_at_page;
    pthread_mutex_t lock;
};

static int cb_fill(void *user, uint64_t off, uint8_t *buf, size_t len) {
    struct cb_state *s = user;
    if (s->fail_at_page >= 0 && off <= (uint64_t)s->fail_at_page * PAGE &&
        (uint64_t)s->fail_at_page * PAGE < off + len)
        return EIO;
    memcpy(buf, s->data + off, len);
    __atomic_fetch_add(&s->fills, 1, __ATOMIC_RELAXED);
    return 0;
}

static int cb_write_back(void *user, uint64_t off, const uint8_t *buf, size_t len) {
    struct cb_state *s = user;
    pthread_mutex_lock(&s->lock);
    memcpy(s->data + off, buf, len);
    s->write_backs++;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static void cb_destroy(void *user) { ((struct cb_state *)user)->destroyed++; }

static fl_store *callback_store(struct cb_state *st, size_t pages, uint32_t flags) {
    st->len = pages * PAGE;
    st->data = malloc(st->len);
    for (size_t i = 0; i < st->len; i++) st->data[i] = pattern(i);
    st->fills = st->write_backs = st->destroyed = 0;
    pthread_mutex_init(&st->lock, NULL);
    fl_store_callbacks cb = {.user = st, .len = st->len, .flags = flags, .fill = cb_fill,
                             .write_back = cb_write_back, .destroy = cb_destroy};
    fl_store *s = NULL;
    CHECK(fl_store_from_callbacks(&cb, &s) == 0);
    return s;
}

static int callbacks(void) {
    struct cb_state st = {.fail_at_page = -1};
    fl_store *s = callback_store(&st, 32, 0);
    /* Not flagged signal-safe: the signal engine refuses it. */
    fl_engine *sig = engine(FL_ENGINE_SIGNAL);
    fl_region *r = NULL;
    CHECK(fl_region_new(sig, 32 * PAGE, s, NULL, &r) == -EINVAL && r == NULL);
    CHECK(strstr(fl_last_error(), "signal") != NULL);
    fl_engine_free(sig);
    fl_engine *e = engine(FL_ENGINE_POLL);
    fl_region_options o;
    fl_region_options_default(&o);
    o.budget_pages = 4;
    o.fault_around = 1;
    CHECK(fl_region_new(e, 32 * PAGE, s, &o, &r) == 0);
    fl_store_free(s);
    fl_engine_free(e);
    unsigned char *p = fl_region_addr(r);
    for (size_t i = 0; i < 32 * PAGE; i += 97) CHECK(p[i] == pattern(i));
    CHECK(st.fills >= 32);
    p[3 * PAGE] = 0x5A;
    CHECK(fl_region_flush(r) >= 1);
    CHECK(st.data[3 * PAGE] == 0x5A && st.write_backs >= 1);
    CHECK(st.destroyed == 0);
    CHECK(fl_region_free(r) == 0);
    CHECK(st.destroyed == 1); /* the last reference ran destroy once */
    free(st.data);
    /* The same store flagged signal-safe works on the signal engine. */
    struct cb_state st2 = {.fail_at_page = -1};
    s = callback_store(&st2, 16, FL_STORE_SIGNAL_SAFE);
    sig = engine(FL_ENGINE_SIGNAL);
    CHECK(fl_region_new(sig, 16 * PAGE, s, NULL, &r) == 0);
    p = fl_region_addr(r);
    for (size_t i = 0; i < 16 * PAGE; i += 61) CHECK(p[i] == pattern(i));
    CHECK(fl_region_free(r) == 0);
    fl_store_free(s);
    fl_engine_free(sig);
    CHECK(st2.destroyed == 1);
    free(st2.data);
    return 0;
}

/* A failing store poisons the page: SIGBUS, never zeros (run in a child). */
static int failing_store(const char *engine_name) {
    static struct cb_state st = {.fail_at_page = 5};
    int sig = strcmp(engine_name, "signal") == 0;
    fl_store *s = callback_store(&st, 16, sig ? FL_STORE_SIGNAL_SAFE : 0);
    fl_engine *e = engine(sig ? FL_ENGINE_SIGNAL : FL_ENGINE_POLL);
    fl_region_options o;
    fl_region_options_default(&o);
    o.fault_around = 1;
    fl_region *r = NULL;
    CHECK(fl_region_new(e, 16 * PAGE, s, &o, &r) == 0);
    volatile unsigned char *p = fl_region_addr(r);
    CHECK(p[4 * PAGE] == pattern(4 * PAGE));
    printf("reading the failing page\n");
    fflush(stdout);
    unsigned char v = p[5 * PAGE + 1]; /* must not return */
    printf("read %u from a page whose store failed\n", v);
    return 1;
}

static int bad_inputs(const char *path) {
    fl_engine *e = engine(FL_ENGINE_SIGNAL);
    fl_region *r = NULL;
    CHECK(fl_region_new(e, 0, NULL, NULL, &r) == -EINVAL && r == NULL);
    CHECK(strlen(fl_last_error()) > 0);
    CHECK(fl_region_new(e, PAGE + 1, NULL, NULL, &r) == -EINVAL);
    fl_region_options o;
    fl_region_options_default(&o);
    o.page_size = 12288;
    CHECK(fl_region_new(e, 12288, NULL, &o, &r) == -EINVAL);
    o.page_size = 0;
    o.size = 8; /* a caller compiled against a smaller struct */
    CHECK(fl_region_new(e, PAGE, NULL, &o, &r) == -EINVAL);
    fl_region_options_default(&o);
    o.flags = 0x80;
    CHECK(fl_region_new(e, PAGE, NULL, &o, &r) == -EINVAL);
    CHECK(fl_region_new(NULL, PAGE, NULL, NULL, &r) == -EINVAL);
    fl_store *s = NULL;
    CHECK(fl_store_file("/nonexistent/faultline", 0, &s) == -ENOENT && s == NULL);
    CHECK(strstr(fl_last_error(), "/nonexistent/faultline") != NULL);
    fl_store_callbacks cb = {0};
    CHECK(fl_store_from_callbacks(&cb, &s) == -EINVAL); /* no fill */
    fl_engine_options eo;
    fl_engine_options_default(&eo);
    eo.kind = 42;
    fl_engine *bad = NULL;
    CHECK(fl_engine_new(&eo, &bad) == -EINVAL && bad == NULL);
    /* A fixed address inside another region. */
    CHECK(fl_region_new(e, 16 * PAGE, NULL, NULL, &r) == 0);
    fl_region *r2 = NULL;
    fl_region_options_default(&o);
    o.addr = (uint64_t)(uintptr_t)fl_region_addr(r) + PAGE;
    CHECK(fl_region_new(e, PAGE, NULL, &o, &r2) < 0 && r2 == NULL);
    CHECK(fl_region_populate(r, 1, PAGE) == -EINVAL);
    CHECK(fl_region_populate(r, 0, 2 * PAGE) == 0 && fl_region_is_resident(r, 0, 2 * PAGE) == 1);
    CHECK(fl_region_free(r) == 0);
    CHECK(fl_region_free(NULL) == 0);
    fl_engine_free(e);
    (void)path;
    return 0;
}

struct worker { unsigned char *base; size_t pages; int id, nthreads; long sum; };

static void *hammer(void *arg) {
    struct worker *w = arg;
    long sum = 0;
    for (size_t p = (size_t)w->id; p < w->pages; p += (size_t)w->nthreads) sum += w->base[p * PAGE + 11];
    for (size_t p = 0; p < w->pages; p++) sum += w->base[p * PAGE + 11]; /* everyone, everywhere */
    w->sum = sum;
    return NULL;
}

static int threads(const char *engine_name) {
    uint32_t kind = strcmp(engine_name, "signal") == 0    ? FL_ENGINE_SIGNAL
                    : strcmp(engine_name, "per-cpu") == 0 ? FL_ENGINE_PER_CPU
                                                          : FL_ENGINE_WORKERS;
    enum { PAGES = 4096, THREADS = 8 };
    unsigned char *snapshot = malloc((size_t)PAGES * PAGE);
    for (size_t i = 0; i < (size_t)PAGES * PAGE; i++) snapshot[i] = pattern(i);
    fl_store *s = NULL;
    CHECK(fl_store_memory(snapshot, (size_t)PAGES * PAGE, &s) == 0);
    fl_engine *e = engine(kind);
    fl_region_options o;
    fl_region_options_default(&o);
    o.fault_around = 1; /* one fault per page: maximum contention */
    fl_region *r = NULL;
    CHECK(fl_region_new(e, (size_t)PAGES * PAGE, s, &o, &r) == 0);
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){fl_region_addr(r), PAGES, i, THREADS, 0};
        CHECK(pthread_create(&t[i], NULL, hammer, &w[i]) == 0);
    }
    long expect_all = 0;
    for (size_t p = 0; p < PAGES; p++) expect_all += pattern(p * PAGE + 11);
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        long own = 0;
        for (size_t p = (size_t)i; p < PAGES; p += THREADS) own += pattern(p * PAGE + 11);
        CHECK(w[i].sum == own + expect_all);
    }
    fl_region_stats st;
    CHECK(fl_region_get_stats(r, &st) == 0);
    CHECK(st.installed == PAGES && st.poisoned == 0);
    CHECK(memcmp(fl_region_addr(r), snapshot, (size_t)PAGES * PAGE) == 0);
    CHECK(fl_region_free(r) == 0);
    fl_store_free(s);
    fl_engine_free(e);
    free(snapshot);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[1], *arg = argc > 2 ? argv[2] : "";
    int rc = 2;
    if (!strcmp(mode, "readback")) rc = file_readback(arg);
    else if (!strcmp(mode, "writeback")) rc = file_writeback(arg);
    else if (!strcmp(mode, "callbacks")) rc = callbacks();
    else if (!strcmp(mode, "failing-store")) rc = failing_store(arg);
    else if (!strcmp(mode, "bad-inputs")) rc = bad_inputs(arg);
    else if (!strcmp(mode, "threads")) rc = threads(arg);
    else if (!strcmp(mode, "version")) { printf("%s\n", fl_version()); rc = 0; }
    if (rc == 0) printf("ok %s\n", mode);
    return rc;
}
