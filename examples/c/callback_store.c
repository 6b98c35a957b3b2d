/*
 * A libfaultline store made of C callbacks: pages are computed on first
 * touch (here: a table of squares), and dirty pages are written back to the
 * callbacks under a resident budget.
 *
 *   callback_store [PAGES]
 *
 * Build: cc -O2 callback_store.c $(pkg-config --cflags --libs faultline) -lpthread
 */
#include <faultline/faultline.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct squares {
    pthread_mutex_t lock;
    uint64_t fills, write_backs, checksum_written;
};

/* Called on a handler thread (poll engine) with a window of pages. */
static int fill(void *user, uint64_t offset, uint8_t *buf, size_t len) {
    struct squares *s = user;
    uint64_t *words = (uint64_t *)buf;
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t k = offset / 8 + i;
        words[i] = k * k;
    }
    __atomic_fetch_add(&s->fills, 1, __ATOMIC_RELAXED);
    return 0;
}

static int write_back(void *user, uint64_t offset, const uint8_t *buf, size_t len) {
    struct squares *s = user;
    uint64_t sum = 0;
    for (size_t i = 0; i < len; i++) sum += buf[i];
    pthread_mutex_lock(&s->lock);
    s->write_backs++;
    s->checksum_written += sum + offset;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int main(int argc, char **argv) {
    size_t pages = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096;
    struct squares sq = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    fl_store_callbacks cb = {.user = &sq, .len = FL_STORE_ENDLESS, .flags = 0,
                             .fill = fill, .write_back = write_back, .destroy = NULL};
    fl_store *store;
    fl_engine *engine;
    fl_engine_options eo;
    fl_engine_options_default(&eo);
    eo.kind = FL_ENGINE_POLL; /* callbacks that lock are not signal-safe */
    if (fl_store_from_callbacks(&cb, &store) < 0 || fl_engine_new(&eo, &engine) < 0) {
        fprintf(stderr, "setup: %s\n", fl_last_error());
        return 1;
    }
    fl_region_options ro;
    fl_region_options_default(&ro);
    ro.budget_pages = pages / 4; /* a quarter of the table resident at once */
    fl_region *r;
    if (fl_region_new(engine, pages * 4096, store, &ro, &r) < 0) {
        fprintf(stderr, "fl_region_new: %s\n", fl_last_error());
        return 1;
    }
    fl_store_free(store);
    fl_engine_free(engine);
    uint64_t *t = fl_region_addr(r);
    size_t n = pages * 4096 / 8;
    for (size_t k = 0; k < n; k += 1000)
        if (t[k] != (uint64_t)k * k) { fprintf(stderr, "t[%zu] wrong\n", k); return 1; }
    for (size_t k = 0; k < n; k += 512) t[k] = 0; /* dirty every page */
    if (fl_region_flush(r) < 0) { fprintf(stderr, "flush: %s\n", fl_last_error()); return 1; }
    fl_region_stats st;
    fl_region_get_stats(r, &st);
    printf("%zu pages: %lu faults, %lu installed, %lu evicted, %lu written back, at most %lu resident (budget %zu)\n",
           pages, (unsigned long)st.faults, (unsigned long)st.installed, (unsigned long)st.evicted,
           (unsigned long)st.written_back, (unsigned long)st.max_resident, ro.budget_pages);
    if (fl_region_free(r) < 0) { fprintf(stderr, "free: %s\n", fl_last_error()); return 1; }
    printf("store: %lu fills, %lu write-backs\n", (unsigned long)sq.fills, (unsigned long)sq.write_backs);
    return sq.write_backs >= pages ? 0 : 1;
}
