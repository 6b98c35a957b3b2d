/*
 * umap/umap.h: LLNL UMap's public API, implemented by libumap over faultline
 * (user-space page faults with userfaultfd). Source compatible with UMap's
 * released header: UMap programs compile and run unchanged; link with
 * `pkg-config --cflags --libs umap`.
 *
 * Differences from UMap (see the README's C/C++ section):
 *  - Where UMap prints an error and aborts, these functions fail: umap()
 *    returns UMAP_FAILED, uunmap()/umap_flush() return -1, with errno set
 *    (EINVAL, EBADF, EEXIST, EOPNOTSUPP, EIO) and a message on stderr.
 *  - UMAP_BUFSIZE is one buffer for every region, as in UMap, and no
 *    fault passes it, but there is no global eviction order:
 *    each region has UMAP_PAGE_EVICTORS evictor threads (at most 8)
 *    that evict that region's pages from UMAP_BUFSIZE * HIGH / 100
 *    pages of all regions together down to UMAP_BUFSIZE * LOW / 100, and
 *    a fault that finds the buffer full evicts pages of its own region.
 *  - Any descriptor, O_DIRECT or not, is read and written through fresh
 *    opens of the same file: ranges the page cache holds are copied from
 *    it, the others (UMAP_PAGESIZE >= 64 KiB) read with O_DIRECT, dirty
 *    pages written back through
 *    the page cache (FAULTLINE_UMAP_FILE_IO=buffered: all through the page
 *    cache; =direct: all with O_DIRECT).
 *  - With UMAP_PAGE_FILLERS unset, file regions resolve faults on the
 *    faulting thread (no filler threads); set, or for a Umap::Store, that
 *    many filler threads do.
 *  - UMAP_READ_AHEAD unset: faultline's adaptive read-ahead; set to N:
 *    every fault installs the aligned window of N + 1 pages.
 *  - UMAP_PAGESIZE that is not a power of two (any multiple of 4096, as
 *    in UMap) is a group of region pages (faultline maps an address to its
 *    page with a shift): faults, prefetches and the buffer take it whole,
 *    but eviction and write-back go by region page.
 *  - umap_fetch_and_pin() pins until uunmap() (UMap has no unpin call);
 *    pinned pages count against the budget.
 *  - Umapped memory is not inherited by fork() (MADV_DONTFORK): in the
 *    child an access to it is a SIGSEGV; umap() again there.
 *  - Without UMAP_PAGE_FILLERS, faults are handled in a SIGBUS handler
 *    installed at the first umap(); a SIGBUS handler of the program's own
 *    must be installed before that (it is chained to), not after (it
 *    would take every fault).
 *  - UMAP_* numbers are read as UMap reads them: leading digits, the rest
 *    ignored; no digit or 0 is unset (each said on stderr).
 */
#ifndef _UMAP_H_
#define _UMAP_H_

#ifdef __cplusplus
  #include <cstdint>
  #include <cstddef>
  #include <cerrno>
  #include <cstring>
  #include "umap/store/Store.hpp"
#else
  #include <stdint.h>
  #include <stddef.h>
#endif

#include <unistd.h>
#include <sys/mman.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Maps `length` bytes of file `fd` from `offset`, paged in on first
 * access (arguments as for mmap(2); flags: UMAP_PRIVATE, optionally
 * UMAP_FIXED). Returns the address or UMAP_FAILED with errno set. */
void* umap(
    void* addr
  , size_t length
  , int prot
  , int flags
  , int fd
  , off_t offset
);

/** Writes the region's dirty pages back and unmaps it. 0, or -1 + errno. */
int uunmap(
    void*  addr
  , size_t length
);

/** Writes every region's dirty pages back. 0, or -1 + errno. */
int umap_flush();

struct umap_prefetch_item {
  void* page_base_addr;
};

int umap_has_write_support();

/** Installs the listed pages now, on the calling thread. */
void umap_prefetch( int npages, struct umap_prefetch_item* page_array );
/** Pins the pages of [paddr, paddr + size) and installs them now; they
 *  stay resident until uunmap(). */
void umap_fetch_and_pin( char* paddr, uint64_t size );
uint64_t umapcfg_get_umap_page_size( void );
uint64_t umapcfg_get_max_fault_events( void );
uint64_t umapcfg_get_num_fillers( void );
uint64_t umapcfg_get_num_evictors( void );
uint64_t umapcfg_get_max_pages_in_buffer( void );
uint64_t umapcfg_get_read_ahead( void );
int      umapcfg_get_evict_low_water_threshold( void );
int      umapcfg_get_evict_high_water_threshold( void );
long     umapcfg_get_system_page_size( void );

/* faultline extension, used by Umap::umap_ex below: a store given as
 * callbacks. read/write return 0 or a positive errno and are called from
 * filler threads, several at once. */
typedef int (*umap_read_fn)(void* user, uint64_t off, uint8_t* buf, size_t nb);
typedef int (*umap_write_fn)(void* user, uint64_t off, const uint8_t* buf, size_t nb);
struct umap_store_ops {
  void*         user;
  umap_read_fn  read;
  umap_write_fn write;
};
void* umap_store(void* addr, size_t length, int prot, int flags, off_t offset,
                 const struct umap_store_ops* ops);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
namespace Umap {
namespace detail {
/* C-callable trampolines from the store callbacks to a Umap::Store.
 * Exceptions never cross into the library: they become EIO. */
extern "C" {
static inline int store_read(void* user, uint64_t off, uint8_t* buf, size_t nb) {
  try {
    ssize_t got = static_cast<Store*>(user)->read_from_store(reinterpret_cast<char*>(buf), nb, (off_t)off);
    if (got < 0) return errno != 0 ? errno : EIO;
    if ((size_t)got < nb) std::memset(buf + got, 0, nb - (size_t)got); /* past the end: zeros */
    return 0;
  } catch (...) {
    return EIO;
  }
}
static inline int store_write(void* user, uint64_t off, const uint8_t* buf, size_t nb) {
  try {
    ssize_t put = static_cast<Store*>(user)->write_to_store(
        const_cast<char*>(reinterpret_cast<const char*>(buf)), nb, (off_t)off);
    if (put < 0) return errno != 0 ? errno : EIO;
    return (size_t)put == nb ? 0 : EIO;
  } catch (...) {
    return EIO;
  }
}
}
} // namespace detail

/** umap() over a store: pages come from store->read_from_store and dirty
 * pages go to store->write_to_store (on filler threads). store == nullptr
 * maps fd as umap() does. The store must outlive the region (uunmap). */
inline void* umap_ex(
    void*         addr
  , std::size_t   length
  , int           prot
  , int           flags
  , int           fd
  , off_t         offset
  , Umap::Store*  store
) {
  if (store == nullptr) return ::umap(addr, length, prot, flags, fd, offset);
  umap_store_ops ops;
  ops.user = store;
  ops.read = &detail::store_read;
  ops.write = &detail::store_write;
  return ::umap_store(addr, length, prot, flags, offset, &ops);
}
} // namespace Umap
#endif // __cplusplus

/*
 * flags
 */
#define UMAP_PRIVATE    MAP_PRIVATE // UMAP_SHARED is not supported (as in UMap)
#define UMAP_FIXED      MAP_FIXED

/*
 * Return codes
 */
#define UMAP_FAILED (void *)-1
#endif // _UMAP_H_
