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
#include <x86intrin.h>
static int uffd; static char *src; static volatile uint64_t hstart, hend;
static void h(int s, siginfo_t *si, void *c){ hstart=__rdtsc(); uint64_t a=(uint64_t)si->si_addr & ~4095UL;
 struct uffdio_copy cp={.dst=a,.src=(uint64_t)src,.len=4096,.mode=UFFDIO_COPY_MODE_DONTWAKE}; ioctl(uffd,UFFDIO_COPY,&cp); hend=__rdtsc(); }
static int cmp(const void*a,const void*b){uint64_t x=*(uint64_t*)a,y=*(uint64_t*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ long n=20000; uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK);
 struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_SIGBUS}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
 src=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(src,7,4096);
 char*r=mmap(0,n*4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(r,n*4096,MADV_NOHUGEPAGE);
 struct uffdio_register reg={.range={(uint64_t)r,n*4096},.mode=UFFDIO_REGISTER_MODE_MISSING}; if(ioctl(uffd,UFFDIO_REGISTER,&reg)){perror("reg");return 1;}
 struct sigaction sa={0}; sa.sa_sigaction=h; sa.sa_flags=SA_SIGINFO|SA_NODEFER; sigaction(SIGBUS,&sa,0);
 uint64_t *lat=malloc(n*8),*tr=malloc(n*8),*rs=malloc(n*8),*rt=malloc(n*8); memset(lat,0,n*8);memset(tr,0,n*8);memset(rs,0,n*8);memset(rt,0,n*8);
 for(long i=0;i<n;i++){ uint64_t t0=__rdtsc(); r[i*4096]=1; uint64_t t1=__rdtsc(); lat[i]=t1-t0; tr[i]=hstart-t0; rs[i]=hend-hstart; rt[i]=t1-hend; }
 qsort(lat,n,8,cmp);qsort(tr,n,8,cmp);qsort(rs,n,8,cmp);qsort(rt,n,8,cmp);
 printf("C SIGBUS COPY write: median total %lu trigger %lu resolve %lu return %lu cycles\n",lat[n/2],tr[n/2],rs[n/2],rt[n/2]); return 0;}
