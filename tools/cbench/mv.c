#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <x86intrin.h>
#define UFFDIO_MOVE_ _IOWR(0xAA, 0x05, struct mv)
struct mv { uint64_t dst, src, len, mode; int64_t move; };
static double now(){struct timespec ts;clock_gettime(CLOCK_MONOTONIC,&ts);return ts.tv_sec+ts.tv_nsec*1e-9;}
static char* amap(size_t len){ char*p=mmap(0,len+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); return (char*)(((uintptr_t)p+(2<<20)-1)&~((2UL<<20)-1)); }
int main(int argc,char**argv){ size_t H=2<<20; int n=atoi(argv[1]); int dstnohuge=atoi(argv[2]);
 int uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK); struct uffdio_api api={.api=UFFD_API,.features=(1<<16)}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
 char*pool=amap(n*H); madvise(pool,n*H,MADV_HUGEPAGE);
 double t0=now(); for(int i=0;i<n;i++) pool[i*H]=1; double tp=now()-t0;
 char*dst=amap(n*H); if(dstnohuge) madvise(dst,n*H,MADV_NOHUGEPAGE);
 struct uffdio_register reg={.range={(uint64_t)dst,n*H},.mode=UFFDIO_REGISTER_MODE_MISSING}; if(ioctl(uffd,UFFDIO_REGISTER,&reg)){perror("reg");return 1;}
 FILE*f=fopen("/proc/self/smaps_rollup","r"); char line[256]; while(fgets(line,256,f)) if(strstr(line,"AnonHuge")) printf("pool %s",line); fclose(f);
 uint64_t c0=__rdtsc(); t0=now();
 for(int i=0;i<n;i++){ struct mv m={(uint64_t)dst+i*H,(uint64_t)pool+i*H,H,0,0}; if(ioctl(uffd,UFFDIO_MOVE_,&m)){perror("move");printf("moved %ld\n",m.move);return 1;} }
 double tm=now()-t0; uint64_t c1=__rdtsc();
 t0=now(); long s=0; for(size_t o=0;o<n*H;o+=4096) s+=dst[o]; double tt=now()-t0;
 f=fopen("/proc/self/smaps_rollup","r"); while(fgets(line,256,f)) if(strstr(line,"AnonHuge")) printf("after %s",line); fclose(f);
 printf("n=%d THP: prepare %.1f us/THP (%.0f ns/page), move %.1f us/THP (%.1f ns/page, %lu cycles/THP), touch after %.1f ns/page sum %ld\n", n, tp*1e6/n, tp*1e9/n/512, tm*1e6/n, tm*1e9/n/512, (c1-c0)/n, tt*1e9/n/512, s);
 return 0;}
