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
struct page_region { uint64_t start, end, categories; };
struct pm_scan_arg { uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask, category_anyof_mask, return_mask; };
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING 1
#define PM_SCAN_CHECK_WPASYNC 2
#define PAGE_IS_WRITTEN 2
#define FEAT_WP_ASYNC (1<<15)
#define FEAT_WP_UNPOP (1<<13)
static int uffd; static uint64_t wpfaults;
static void h(int s, siginfo_t *si, void *c){ uint64_t a=(uint64_t)si->si_addr & ~4095UL;
  struct uffdio_writeprotect w={.range={a,4096},.mode=0}; ioctl(uffd,UFFDIO_WRITEPROTECT,&w); wpfaults++; }
static int cmp(const void*a,const void*b){uint64_t x=*(uint64_t*)a,y=*(uint64_t*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ long n=20000; int async=atoi(argv[1]);
 uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK);
 struct uffdio_api api={.api=UFFD_API,.features= async ? (FEAT_WP_ASYNC|FEAT_WP_UNPOP|UFFD_FEATURE_PAGEFAULT_FLAG_WP) : (UFFD_FEATURE_SIGBUS|UFFD_FEATURE_PAGEFAULT_FLAG_WP)};
 if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
 char*r=mmap(0,n*4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(r,n*4096,MADV_NOHUGEPAGE);
 for(long i=0;i<n;i++) r[i*4096]=1; /* populate */
 struct uffdio_register reg={.range={(uint64_t)r,n*4096},.mode=UFFDIO_REGISTER_MODE_WP}; if(ioctl(uffd,UFFDIO_REGISTER,&reg)){perror("reg");return 1;}
 struct sigaction sa={0}; sa.sa_sigaction=h; sa.sa_flags=SA_SIGINFO|SA_NODEFER; sigaction(SIGBUS,&sa,0);
 int pm=open("/proc/self/pagemap",O_RDONLY);
 struct page_region *vec=malloc(sizeof(*vec)*n);
 struct pm_scan_arg arg={.size=sizeof(arg),.flags=PM_SCAN_WP_MATCHING|PM_SCAN_CHECK_WPASYNC,.start=(uint64_t)r,.end=(uint64_t)r+n*4096,.vec=(uint64_t)vec,.vec_len=n,.category_mask=PAGE_IS_WRITTEN,.return_mask=PAGE_IS_WRITTEN};
 uint64_t t0,t1;
 // Protect everything (async: a first scan with WP_MATCHING protects all).
 if(async){ long k=ioctl(pm,PAGEMAP_SCAN,&arg); if(k<0){perror("scan");return 1;} }
 else { struct uffdio_writeprotect w={.range={(uint64_t)r,n*4096},.mode=UFFDIO_WRITEPROTECT_MODE_WP}; if(ioctl(uffd,UFFDIO_WRITEPROTECT,&w)){perror("wp");return 1;} }
 uint64_t *lat=malloc(n*8);
 for(long i=0;i<n;i++){ t0=__rdtsc(); r[i*4096+8]=2; t1=__rdtsc(); lat[i]=t1-t0; }
 // Find the dirty pages and re-protect them (what eviction/write-back needs).
 t0=__rdtsc(); long regions=0, pages=0;
 if(async){ regions=ioctl(pm,PAGEMAP_SCAN,&arg); for(long k=0;k<regions;k++) pages+=(vec[k].end-vec[k].start)/4096; }
 else { struct uffdio_writeprotect w={.range={(uint64_t)r,n*4096},.mode=UFFDIO_WRITEPROTECT_MODE_WP}; ioctl(uffd,UFFDIO_WRITEPROTECT,&w); pages=wpfaults; }
 t1=__rdtsc();
 qsort(lat,n,8,cmp);
 printf("%s: first write to a clean page median %lu cycles p99 %lu; find+re-protect %ld dirty pages: %lu cycles total (%lu/page)\n",
   async?"WP_ASYNC+PAGEMAP_SCAN":"sync WP (SIGBUS)", lat[n/2], lat[n*99/100], pages, t1-t0, (t1-t0)/(pages?pages:1));
 return 0; }
