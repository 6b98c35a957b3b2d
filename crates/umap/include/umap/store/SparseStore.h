/*
 * umap/store/SparseStore.h: UMap's sparse multi-file store, source
 * compatible with UMap's class (its `umap-sparsestore` program compiles
 * unchanged). A region of `rsize` bytes is kept in a directory as files of
 * `file_size` bytes each, named 0, 1, 2, ..., created (and preallocated)
 * when a page in them is first read or written; `_metadata` holds the file
 * size and the capacity on two lines. Pass the store to Umap::umap_ex()
 * (fd -1) and delete it after uunmap().
 *
 * Differences from UMap's (all where UMap would misbehave):
 *  - Files are opened without O_DIRECT: the region's buffers need not be
 *    aligned, and a read or write may span two files (read-ahead).
 *  - Opened read-only, a file that does not exist yet reads as zeros and
 *    is not created; an offset past the capacity fails (EINVAL) instead of
 *    indexing past the table of files.
 *  - get_current_capacity() is also right for a store just created.
 *  - Errors throw std::system_error (UMap throws its own Umap::Exception),
 *    or, from the read/write calls, return -1 with errno set.
 */
#ifndef _UMAP_SPARSE_STORE_H_
#define _UMAP_SPARSE_STORE_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "umap/store/Store.hpp"
#include "umap/umap.h"

namespace Umap {
class SparseStore : public Store {
  public:
    /** Create mode: a new store of `rsize` bytes in the new directory
     * `root_path` (it must not exist), files of `file_size` bytes (rounded
     * up to a multiple of `aligned_size`, the UMap page size). */
    SparseStore(std::size_t rsize, std::size_t aligned_size, std::string root_path, std::size_t file_size)
      : rsize_(rsize), aligned_size_(aligned_size ? aligned_size : 4096), read_only_(false), root_path_(root_path) {
      file_size_ = round_up(file_size ? file_size : aligned_size_, aligned_size_);
      capacity_ = file_size_ > rsize_ ? file_size_ : rsize_;
      struct stat st;
      if (::stat(root_path_.c_str(), &st) == 0)
        throw std::system_error(EEXIST, std::generic_category(),
            "SparseStore: " + root_path_ + " exists; open it with SparseStore(root_path, read_only)");
      if (::mkdir(root_path_.c_str(), S_IRWXU | S_IRWXG | S_IROTH | S_IXOTH) != 0)
        throw std::system_error(errno, std::generic_category(), "SparseStore: creating " + root_path_);
      std::ofstream metadata(metadata_path(root_path_).c_str());
      if (!metadata)
        throw std::system_error(errno ? errno : EIO, std::generic_category(),
            "SparseStore: writing " + metadata_path(root_path_));
      metadata << file_size_ << std::endl << capacity_;
      if (!metadata.flush())
        throw std::system_error(EIO, std::generic_category(),
            "SparseStore: writing " + metadata_path(root_path_));
      fds_.assign(files_for(capacity_), -1);
    }

    /** Open mode: the store in `root_path` (its `_metadata`), read-only or
     * read-write. */
    SparseStore(std::string root_path, bool read_only)
      : rsize_(0), aligned_size_(0), read_only_(read_only), root_path_(root_path) {
      std::ifstream metadata(metadata_path(root_path_).c_str());
      if (!metadata)
        throw std::system_error(errno ? errno : ENOENT, std::generic_category(),
            "SparseStore: opening " + metadata_path(root_path_));
      if (!(metadata >> file_size_ >> capacity_) || file_size_ == 0)
        throw std::system_error(EINVAL, std::generic_category(),
            "SparseStore: " + metadata_path(root_path_) + " does not hold a file size and a capacity");
      rsize_ = capacity_;
      fds_.assign(files_for(capacity_), -1);
    }

    ~SparseStore() { close_files(); }

    SparseStore(const SparseStore&) = delete;
    SparseStore& operator=(const SparseStore&) = delete;

    /** Reads nb bytes at off (across files as needed): nb, or -1 + errno. */
    ssize_t read_from_store(char* buf, std::size_t nb, off_t off) override {
      return io(buf, nb, off, false);
    }

    /** Writes nb bytes at off (across files as needed): nb, or -1 + errno. */
    ssize_t write_to_store(char* buf, std::size_t nb, off_t off) override {
      if (read_only_) { errno = EBADF; return -1; }
      return io(buf, nb, off, true);
    }

    /** The store's capacity in bytes (from `_metadata`). */
    std::size_t get_current_capacity() { return capacity_; }

    /** The capacity of the store in `base_path`, without opening it. */
    static std::size_t get_capacity(std::string base_path) {
      std::ifstream metadata(metadata_path(base_path).c_str());
      std::size_t file_size = 0, capacity = 0;
      if (!metadata || !(metadata >> file_size >> capacity))
        throw std::system_error(errno ? errno : EINVAL, std::generic_category(),
            "SparseStore: reading " + metadata_path(base_path));
      return capacity;
    }

    /** Closes every open file: 0, or -1 if a close failed (errno set). */
    int close_files() {
      std::lock_guard<std::mutex> lock(mutex_);
      int rc = 0;
      for (auto& fd : fds_) {
        if (fd >= 0 && ::close(fd) != 0) rc = -1;
        fd = -1;
      }
      return rc;
    }

  private:
    std::size_t rsize_;
    std::size_t aligned_size_;
    std::size_t file_size_ = 0;
    std::size_t capacity_ = 0;
    bool read_only_;
    std::string root_path_;
    std::vector<int> fds_;
    std::mutex mutex_;

    static std::string metadata_path(const std::string& root) { return root + "/_metadata"; }
    static std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
    std::size_t files_for(std::size_t bytes) const { return (bytes + file_size_ - 1) / file_size_; }

    /* The descriptor of file `index`, opened (and in read-write mode
     * created and preallocated) on first use; -2: a missing file of a
     * read-only store (reads as zeros); -1: error, errno set. */
    int fd_of(std::size_t index) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fds_[index] >= 0) return fds_[index];
      std::string path = root_path_ + "/" + std::to_string(index);
      int fd = ::open(path.c_str(), (read_only_ ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, S_IRUSR | S_IWUSR);
      if (fd < 0) return (read_only_ && errno == ENOENT) ? -2 : -1;
      if (!read_only_) {
        int err = ::posix_fallocate(fd, 0, (off_t)file_size_);
        if (err != 0 && err != EOPNOTSUPP) { ::close(fd); errno = err; return -1; }
      }
      fds_[index] = fd;
      return fd;
    }

    ssize_t io(char* buf, std::size_t nb, off_t off, bool write) {
      if (off < 0 || (std::size_t)off + nb > capacity_) { errno = EINVAL; return -1; }
      std::size_t done = 0;
      while (done < nb) {
        std::size_t at = (std::size_t)off + done;
        std::size_t index = at / file_size_, in_file = at % file_size_;
        std::size_t n = file_size_ - in_file;
        if (n > nb - done) n = nb - done;
        int fd = fd_of(index);
        if (fd == -1) return -1;
        std::size_t k = 0;
        while (k < n) {
          ssize_t r;
          if (fd == -2) {  /* not created yet: zeros */
            for (std::size_t i = k; i < n; i++) buf[done + i] = 0;
            break;
          }
          r = write ? ::pwrite(fd, buf + done + k, n - k, (off_t)(in_file + k))
                    : ::pread(fd, buf + done + k, n - k, (off_t)(in_file + k));
          if (r < 0) { if (errno == EINTR) continue; return -1; }
          if (r == 0) {  /* past the end of a short file: zeros */
            if (write) { errno = EIO; return -1; }
            for (std::size_t i = k; i < n; i++) buf[done + i] = 0;
            break;
          }
          k += (std::size_t)r;
        }
        done += n;
      }
      return (ssize_t)nb;
    }
};
} // namespace Umap
#endif // _UMAP_SPARSE_STORE_H_
