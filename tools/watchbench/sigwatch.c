/*
 * sigwatch: a write watchpoint "built the usual way" with mprotect + SIGSEGV +
 * the trap flag, timed step by step with the TSC (seed 002, Table 4.1, the
 * "Signal Handling" column).
 *
 * Build and run:  cc -O2 -o sigwatch sigwatch.c && ./sigwatch [writes] [watched]
 *   writes   timed writes per mode (default 20000; 1000 more, untimed, warm up)
 *   watched  watched byte addresses in the page (default 16, at most 4096)
 *
 * One 4 KiB page is mprotect'ed PROT_READ. Every write to it:
 *
 *   loop    t0 = rdtsc; *p = v; t8 = rdtsc           (p: pseudo-random byte of the page)
 *   (1)     CPU #PF -> kernel -> SIGSEGV frame -> on_segv: t1 = first line
 *   (2)     binary search of si_addr in the sorted watched[] array   -> t2
 *   (3)     mprotect(page, PROT_READ|PROT_WRITE)                      -> t3
 *           set EFLAGS.TF in the saved context;                       t4 = last line
 *   (4)     return from the handler: rt_sigreturn restores the context (TF set)
 *   (5)     the store re-executes and completes; TF raises #DB after it ->
 *           kernel -> SIGTRAP frame -> on_trap: t5 = first line
 *   (6)     mprotect(page, PROT_READ)                                 -> t6
 *           clear TF in the saved context;                            t7 = last line
 *   (7)     return from the SIGTRAP handler to the loop               -> t8
 *
 * Mode "tf" measures exactly this. Rows (4) and (5) cannot be separated there:
 * the only instruction between the two kernel exits is the store itself, so
 * t5 - t4 covers sigreturn + store + #DB + SIGTRAP delivery. Mode "plain"
 * calibrates (4): its SIGSEGV handler only unprotects (no TF), so t8 - t4 is
 * sigreturn + the store completing; the loop then re-protects the page outside
 * any handler (timed as "reprotect"). The Rust side reports
 * (5) = tf.exit_to_trap - plain.exit.
 *
 * Output: one key=value per line. Each timed row prints <mode>.<row>.median,
 * .p99 and .min in TSC cycles (nearest-rank percentiles on the sorted samples,
 * rank ceil(p/100 * n)); every rdtsc (lfence; rdtsc; lfence) pair adds its own
 * ~20-40 cycles to each row.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <x86intrin.h>

#define PAGE 4096
#define TF 0x100UL
#define WARMUP 1000

static inline uint64_t tsc(void)
{
	_mm_lfence();
	uint64_t t = __rdtsc();
	_mm_lfence();
	return t;
}

static char *page;
static uintptr_t watched[PAGE];
static int nwatched;
static int use_tf;

/* Timestamps of the current event, written by the handlers. */
static volatile uint64_t t_entry, t_lookup, t_allow, t_exit;
static volatile uint64_t t_trap, t_restore, t_trap_exit;
static volatile uint64_t hits, false_positives, segv_count, trap_count;

/* xorshift64, the same generator as tools/watchbench/gdbtarget.c. */
static uint64_t rng;
static uint64_t next_rand(void)
{
	uint64_t x = rng;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng = x;
}

static int cmp_uptr(const void *a, const void *b)
{
	uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
	return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Is `a` one of the watched addresses? (binary search) */
static int is_watched(uintptr_t a)
{
	int lo = 0, hi = nwatched;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (watched[mid] < a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < nwatched && watched[lo] == a;
}

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
	uint64_t t1 = tsc(); /* (1) ends, (2) starts */
	uintptr_t a = (uintptr_t)si->si_addr;
	(void)sig;
	if (a - (uintptr_t)page >= PAGE) {
		/* A real crash: let it happen with the default action. */
		signal(SIGSEGV, SIG_DFL);
		return;
	}
	if (is_watched(a))
		hits++;
	else
		false_positives++;
	uint64_t t2 = tsc(); /* (2) ends, (3) starts */
	mprotect(page, PAGE, PROT_READ | PROT_WRITE);
	uint64_t t3 = tsc(); /* (3) ends */
	if (use_tf)
		((ucontext_t *)ctx)->uc_mcontext.gregs[REG_EFL] |= TF;
	segv_count++;
	t_entry = t1;
	t_lookup = t2;
	t_allow = t3;
	t_exit = tsc(); /* (4) starts */
}

static void on_trap(int sig, siginfo_t *si, void *ctx)
{
	uint64_t t5 = tsc(); /* (4)+(5) end, (6) starts */
	ucontext_t *uc = ctx;
	(void)sig;
	(void)si;
	mprotect(page, PAGE, PROT_READ);
	uint64_t t6 = tsc(); /* (6) ends */
	uc->uc_mcontext.gregs[REG_EFL] &= ~TF;
	trap_count++;
	t_trap = t5;
	t_restore = t6;
	t_trap_exit = tsc(); /* (7) starts */
}

enum {
	R_ENTRY,	/* (1) t1 - t0 */
	R_LOOKUP,	/* (2) t2 - t1 */
	R_ALLOW,	/* (3) t3 - t2 */
	R_EXIT,		/* tf: (4)+(5) t5 - t4; plain: (4) t8 - t4 */
	R_RESTORE,	/* tf: (6) t6 - t5; plain: mprotect R in the loop */
	R_RETURN,	/* tf: (7) t8 - t7; plain: unused */
	R_TOTAL,	/* t8 - t0 */
	NROWS
};

static const char *row_name[2][NROWS] = {
	{"entry", "lookup", "allow", "exit", "reprotect", "unused", "total"},
	{"entry", "lookup", "allow", "exit_to_trap", "restore", "trap_return", "total"},
};

static void die(const char *what)
{
	fprintf(stderr, "sigwatch: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void run(int tf, long n, const uint32_t *off, uint64_t *s[NROWS])
{
	const char *mode = tf ? "tf" : "plain";
	use_tf = tf;
	hits = false_positives = segv_count = trap_count = 0;
	if (mprotect(page, PAGE, PROT_READ))
		die("mprotect PROT_READ");
	for (long i = -WARMUP; i < n; i++) {
		volatile char *p = page + off[(i + WARMUP) % n];
		if (i == 0)
			hits = false_positives = 0; /* count the timed writes only */
		uint64_t t0 = tsc();
		*p = (char)i;
		uint64_t t8 = tsc();
		uint64_t r0 = 0, r1 = 0;
		if (!tf) {
			r0 = tsc();
			mprotect(page, PAGE, PROT_READ);
			r1 = tsc();
		}
		if (i < 0)
			continue;
		s[R_ENTRY][i] = t_entry - t0;
		s[R_LOOKUP][i] = t_lookup - t_entry;
		s[R_ALLOW][i] = t_allow - t_lookup;
		s[R_TOTAL][i] = t8 - t0;
		if (tf) {
			s[R_EXIT][i] = t_trap - t_exit;
			s[R_RESTORE][i] = t_restore - t_trap;
			s[R_RETURN][i] = t8 - t_trap_exit;
		} else {
			s[R_EXIT][i] = t8 - t_exit;
			s[R_RESTORE][i] = r1 - r0;
			s[R_RETURN][i] = 0;
		}
	}
	long events = n + WARMUP;
	if ((long)segv_count != events || (tf && (long)trap_count != events)) {
		fprintf(stderr, "sigwatch: %s: %lu SIGSEGV and %lu SIGTRAP for %ld writes\n",
			mode, (unsigned long)segv_count, (unsigned long)trap_count, events);
		exit(1);
	}
	printf("%s.hits=%lu\n", mode, (unsigned long)hits);
	printf("%s.false_positives=%lu\n", mode, (unsigned long)false_positives);
	for (int r = 0; r < NROWS; r++) {
		if (!tf && r == R_RETURN)
			continue;
		qsort(s[r], n, sizeof(uint64_t), cmp_u64);
		/* nearest rank: ceil(p/100 * n), 1-based */
		long med = (n + 1) / 2, p99 = (99 * n + 99) / 100;
		printf("%s.%s.median=%lu\n", mode, row_name[tf][r], (unsigned long)s[r][med - 1]);
		printf("%s.%s.p99=%lu\n", mode, row_name[tf][r], (unsigned long)s[r][p99 - 1]);
		printf("%s.%s.min=%lu\n", mode, row_name[tf][r], (unsigned long)s[r][0]);
	}
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 20000;
	nwatched = argc > 2 ? atoi(argv[2]) : 16;
	if (n < 1 || nwatched < 1 || nwatched > PAGE) {
		fprintf(stderr, "usage: sigwatch [writes >= 1] [watched 1..4096]\n");
		return 2;
	}

	/* Stay on one CPU so no sample spans a migration. */
	cpu_set_t set;
	CPU_ZERO(&set);
	int cpu = sched_getcpu();
	CPU_SET(cpu < 0 ? 0 : cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);

	page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		die("mmap");
	memset(page, 1, PAGE);

	/* Watched addresses: `nwatched` distinct bytes, sorted. Written offsets:
	 * pseudo-random bytes of the page (the same sequence in both modes). */
	rng = 0x9E3779B97F4A7C15ULL ^ 42;
	static unsigned char taken[PAGE];
	for (int k = 0; k < nwatched;) {
		uint32_t o = next_rand() % PAGE;
		if (!taken[o]) {
			taken[o] = 1;
			watched[k++] = (uintptr_t)page + o;
		}
	}
	qsort(watched, nwatched, sizeof(uintptr_t), cmp_uptr);
	uint32_t *off = malloc(n * sizeof(uint32_t));
	uint64_t *s[NROWS];
	if (!off)
		die("malloc");
	for (long i = 0; i < n; i++)
		off[i] = next_rand() % PAGE;
	for (int r = 0; r < NROWS; r++) {
		/* Touched now so the sample arrays do not fault in the loop. */
		s[r] = malloc(n * sizeof(uint64_t));
		if (!s[r])
			die("malloc");
		memset(s[r], 0, n * sizeof(uint64_t));
	}

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_flags = SA_SIGINFO;
	sa.sa_sigaction = on_segv;
	if (sigaction(SIGSEGV, &sa, NULL))
		die("sigaction SIGSEGV");
	sa.sa_sigaction = on_trap;
	if (sigaction(SIGTRAP, &sa, NULL))
		die("sigaction SIGTRAP");

	printf("writes=%ld\nwatched=%d\ncpu=%d\n", n, nwatched, cpu);
	run(1, n, off, s);
	run(0, n, off, s);
	return 0;
}
