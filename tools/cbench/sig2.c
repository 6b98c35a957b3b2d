#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
static int uffd; static char *src; static char *r; static long per;
static void h(int s, siginfo_t *si, void *c){ uint64_t a=(uint64_t)si->si_addr & ~4095UL;
 struct uffdio_copy cp={.dst=a,.src=(uint64_t)src,.len=4096,.mode=UFFDIO_COPY_MODE_DONTWAKE}; ioctl(uffd,UFFDIO_COPY,&cp); }
static void* w(void*arg){ long t=(long)arg; for(long i=0;i<per;i++) r[(t*per+i)*4096]=1; return 0;}
static double now(){struct timespec ts;clock_gettime(CLOCK_MONOTONIC,&ts);return ts.tv_sec+ts.tv_nsec*1e-9;}
int main(int argc,char**argv){ int T=atoi(argv[1]); int mode=atoi(argv[2]); per=16384; long n=per*T;
 uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK);
 struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_SIGBUS}; ioctl(uffd,UFFDIO_API,&api);
 src=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(src,7,4096);
 r=mmap(0,n*4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(r,n*4096,MADV_NOHUGEPAGE);
 if(mode){struct uffdio_register reg={.range={(uint64_t)r,n*4096},.mode=UFFDIO_REGISTER_MODE_MISSING}; ioctl(uffd,UFFDIO_REGISTER,&reg);}
 struct sigaction sa={0}; sa.sa_sigaction=h; sa.sa_flags=SA_SIGINFO|SA_NODEFER; sigaction(SIGBUS,&sa,0);
 pthread_t th[16]; double t0=now(); for(long t=0;t<T;t++) pthread_create(&th[t],0,w,(void*)t); for(int t=0;t<T;t++) pthread_join(th[t],0);
 printf("%s T=%d: %.0f faults/s\n", mode?"uffd-sigbus":"kernel", T, n/(now()-t0)); return 0;}
