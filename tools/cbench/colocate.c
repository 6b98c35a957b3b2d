// Where the handler thread runs against the faulting thread: one
// userfaultfd (MISSING, anonymous memory), F faulting threads touching one
// byte of each of their pages, H handler threads answering with a 4 KiB
// UFFDIO_COPY. On a KVM guest a wake-up that crosses CPUs costs an
// inter-processor interrupt to a halted vCPU; one on the same CPU does not.
//
//   colocate F PLACE WAIT [PAGES]
//     F      faulting threads, thread i pinned to CPU i % ncpu
//     PLACE  other: one handler pinned to the CPU after the last faulter's
//            same:  one handler pinned to CPU 0 (with F=1: the faulter's)
//            percpu: one handler pinned on each CPU
//            free:  one handler, not pinned (the scheduler places it)
//     WAIT   poll: handlers sleep in poll(2) between messages
//            spin: handlers read the non-blocking fd in a loop
//     PAGES  per faulting thread (default 20000)
//     awake  (optional, after PAGES) a SCHED_IDLE thread spinning on each
//            CPU: no CPU halts while a faulting thread sleeps
// Prints the wall time per fault, the median and p99 touch (TSC cycles)
// and the CPU time of the whole process.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

static int uffd, spin, ncpu;
static long per;
static char *src, *mem;
static atomic_int stop;
static unsigned long *touch;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *handler(void *arg) {
  long cpu = (long)arg;
  if (cpu >= 0) pin(cpu);
  struct uffd_msg m;
  while (!atomic_load(&stop)) {
    if (read(uffd, &m, sizeof m) < 0) {
      if (errno != EAGAIN) { perror("read"); exit(1); }
      if (spin) { _mm_pause(); continue; }
      struct pollfd p = {uffd, POLLIN, 0};
      poll(&p, 1, 50);
      continue;
    }
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~4095UL,
                            .src = (unsigned long)src, .len = 4096};
    if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) { perror("copy"); exit(1); }
  }
  return 0;
}

static void *awake(void *arg) {
  pin((long)arg);
  struct sched_param p = {0};
  if (sched_setscheduler(0, SCHED_IDLE, &p)) perror("SCHED_IDLE");
  while (!atomic_load(&stop)) _mm_pause();
  return 0;
}

static void *faulter(void *arg) {
  long id = (long)arg;
  pin(id % ncpu);
  volatile char s = 0;
  char *b = mem + id * per * 4096;
  for (long i = 0; i < per; i++) {
    unsigned long t = __rdtsc();
    s += b[i * 4096];
    touch[id * per + i] = __rdtsc() - t;
  }
  return 0;
}

static int cmp(const void *a, const void *b) {
  unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
  return x < y ? -1 : x > y;
}

static double now(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: colocate F other|same|percpu|free poll|spin [PAGES [awake]]\n"); return 2; }
  int f = atoi(argv[1]);
  const char *place = argv[2];
  spin = !strcmp(argv[3], "spin");
  per = argc > 4 ? atol(argv[4]) : 20000;
  ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (f < 1 || f > 64) { fprintf(stderr, "F: 1 to 64\n"); return 2; }
  src = aligned_alloc(4096, 4096);
  memset(src, 7, 4096);
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  struct uffdio_api api = {.api = UFFD_API};
  if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("userfaultfd"); return 1; }
  long n = f * per;
  mem = mmap(0, n * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(mem, n * 4096, MADV_NOHUGEPAGE);
  struct uffdio_register reg = {.range = {(unsigned long)mem, n * 4096},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("register"); return 1; }
  touch = calloc(n, sizeof *touch);
  pthread_t h[64], t[64], a[64];
  int nh = 0, na = 0;
  if (argc > 5 && !strcmp(argv[5], "awake"))
    for (long c = 0; c < ncpu && na < 64; c++) pthread_create(&a[na++], 0, awake, (void *)c);
  if (!strcmp(place, "percpu"))
    for (long c = 0; c < ncpu && nh < 64; c++) pthread_create(&h[nh++], 0, handler, (void *)c);
  else if (!strcmp(place, "other"))
    pthread_create(&h[nh++], 0, handler, (void *)(long)(f % ncpu));
  else if (!strcmp(place, "same"))
    pthread_create(&h[nh++], 0, handler, (void *)0L);
  else if (!strcmp(place, "free"))
    pthread_create(&h[nh++], 0, handler, (void *)-1L);
  else { fprintf(stderr, "PLACE: other, same, percpu or free\n"); return 2; }
  usleep(20000);
  double c0 = now(CLOCK_PROCESS_CPUTIME_ID), t0 = now(CLOCK_MONOTONIC);
  for (long i = 0; i < f; i++) pthread_create(&t[i], 0, faulter, (void *)i);
  for (int i = 0; i < f; i++) pthread_join(t[i], 0);
  double wall = now(CLOCK_MONOTONIC) - t0, cpu = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
  atomic_store(&stop, 1);
  for (int i = 0; i < nh; i++) pthread_join(h[i], 0);
  for (int i = 0; i < na; i++) pthread_join(a[i], 0);
  qsort(touch, n, sizeof *touch, cmp);
  printf("F=%d %s %s%s: %.2f us a fault per faulting thread, touch median %lu p99 %lu cycles, CPU %.0f ms over %.0f ms\n",
         f, place, argv[3], na ? " awake" : "", wall / per * 1e6, touch[n / 2], touch[n * 99 / 100], cpu * 1e3, wall * 1e3);
  return 0;
}
