/*
 * umap/store/Store.hpp: UMap's store plug-in interface (source compatible
 * with UMap's). Subclass Umap::Store and pass it to Umap::umap_ex().
 */
#ifndef _UMAP_STORE_H_
#define _UMAP_STORE_H_
#include <cstdint>
#include <cstddef>
#include <unistd.h>

namespace Umap {
class Store {
  public:
    virtual ~Store() {}

    /** A store over file `fd` (pread/pwrite); region, rsize and alignsize
     * are accepted for compatibility. Delete it after uunmap(). */
    static Store* make_store(void* _region_, std::size_t _rsize_, std::size_t _alignsize_, int _fd_);

    /** Reads nb bytes at off into buf: the bytes read, or -1 with errno. */
    virtual ssize_t read_from_store(char* buf, std::size_t nb, off_t off) = 0;
    /** Writes nb bytes at off from buf: the bytes written, or -1 with errno. */
    virtual ssize_t  write_to_store(char* buf, std::size_t nb, off_t off) = 0;

    /** Offsets worth reading ahead of off (UMap's hook; not called here:
     * read-ahead follows UMAP_READ_AHEAD). */
    virtual int predict_offsets(off_t* offsets, off_t off) { (void)offsets; (void)off; return 0; }
};

namespace detail {
class FileStore : public Store {
  public:
    explicit FileStore(int fd) : fd_(fd) {}
    ssize_t read_from_store(char* buf, std::size_t nb, off_t off) override {
      std::size_t done = 0;
      while (done < nb) {
        ssize_t n = ::pread(fd_, buf + done, nb - done, off + (off_t)done);
        if (n < 0) return -1;
        if (n == 0) break;
        done += (std::size_t)n;
      }
      return (ssize_t)done;
    }
    ssize_t write_to_store(char* buf, std::size_t nb, off_t off) override {
      std::size_t done = 0;
      while (done < nb) {
        ssize_t n = ::pwrite(fd_, buf + done, nb - done, off + (off_t)done);
        if (n < 0) return -1;
        done += (std::size_t)n;
      }
      return (ssize_t)done;
    }
  private:
    int fd_;
};
} // namespace detail

inline Store* Store::make_store(void*, std::size_t, std::size_t, int fd) {
  return new detail::FileStore(fd);
}
} // end of namespace Umap
#endif
