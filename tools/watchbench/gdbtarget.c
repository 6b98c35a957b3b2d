/*
 * gdbtarget: the seed 002 Table 4.6 workload (write every byte of a block of
 * consecutive pages), built -O0 -g so GDB can watch its memory.
 *
 * Build:  cc -O0 -g -o gdbtarget gdbtarget.c
 * Run:    ./gdbtarget PAGES N SEED REPS BYTES
 *   PAGES  4 KiB pages in the block (aligned_alloc, zero-filled)
 *   N      watched addresses to pick (0..MAX_WATCH, at most BYTES)
 *   SEED   seed of the address selection (below)
 *   REPS   passes over the written bytes
 *   BYTES  bytes written per pass: the first BYTES bytes of the block
 *          (1..PAGES*4096; caps the single-stepped software-watchpoint runs)
 *
 * Address selection (the same as `random_offsets` in
 * crates/faultline-bench/src/bench/watch/gdb.rs: same seed, same offsets):
 *   x = SEED ^ 0x9E3779B97F4A7C15; if x == 0 then x = 0x9E3779B97F4A7C15
 *   repeat: x ^= x << 13; x ^= x >> 7; x ^= x << 17   (xorshift64, u64 wrapping)
 *           o = x % BYTES; keep o if not already kept
 *   until N offsets are kept, in the order they were drawn.
 * watch_addrs[i] = block + offset i. The offsets are drawn from the written
 * range, so every watched byte is written once per pass.
 *
 * After picking them it calls ready() (noinline, empty): a debugger breaks
 * there and sets `watch -l *(char*)watch_addrs[i]` for each i < N. Then it
 * times with rdtsc the loop
 *     for (r = 0; r < REPS; r++) for (i = 0; i < BYTES; i++) block[i] = (char)(r + 1);
 * and prints `cycles=<TSC cycles of the loop>`, `writes=<REPS*BYTES>` and
 * `watched=<N>`. Pass r writes r + 1 over the r of the previous pass (0 before
 * the first), so every write changes the byte: GDB's `watch` stops only when
 * the value changes, and this makes each write to a watched byte one stop.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#define PAGE 4096
#define MAX_WATCH 1024

char *block;
char *watch_addrs[MAX_WATCH];
int n_watch;

__attribute__((noinline)) void ready(void)
{
	__asm__ volatile("" ::: "memory");
}

static uint64_t tsc(void)
{
	_mm_lfence();
	uint64_t t = __rdtsc();
	_mm_lfence();
	return t;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: gdbtarget PAGES N SEED REPS BYTES\n");
		return 2;
	}
	long pages = atol(argv[1]);
	long n = atol(argv[2]);
	uint64_t seed = strtoull(argv[3], NULL, 0);
	long reps = atol(argv[4]);
	long bytes = atol(argv[5]);
	long len = pages * PAGE;
	if (pages < 1 || bytes < 1 || bytes > len || n < 0 || n > MAX_WATCH || n > bytes ||
	    reps < 1 || reps > 255) {
		fprintf(stderr, "gdbtarget: bad arguments (PAGES >= 1, 1 <= BYTES <= PAGES*4096, "
				"0 <= N <= min(%d, BYTES), 1 <= REPS <= 255)\n", MAX_WATCH);
		return 2;
	}
	block = aligned_alloc(PAGE, len);
	if (!block) {
		perror("gdbtarget: aligned_alloc");
		return 1;
	}
	memset(block, 0, len);

	uint64_t x = seed ^ 0x9E3779B97F4A7C15ULL;
	if (x == 0)
		x = 0x9E3779B97F4A7C15ULL;
	for (n_watch = 0; n_watch < n;) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		char *a = block + (long)(x % (uint64_t)bytes);
		int dup = 0;
		for (int k = 0; k < n_watch; k++)
			dup |= watch_addrs[k] == a;
		if (!dup)
			watch_addrs[n_watch++] = a;
	}

	ready();

	uint64_t t0 = tsc();
	for (long r = 0; r < reps; r++)
		for (long i = 0; i < bytes; i++)
			block[i] = (char)(r + 1);
	uint64_t t1 = tsc();

	printf("cycles=%llu\nwrites=%ld\nwatched=%d\n", (unsigned long long)(t1 - t0),
	       reps * bytes, n_watch);
	fflush(stdout);
	return 0;
}
