// Umap::Store plug-ins through Umap::umap_ex; run by tests/umap_c.rs.
// usage: umap_store MODE [FILE]; prints "ok MODE" on success.
#include <umap/umap.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <vector>

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", __FILE__, __LINE__,    \
                   #cond, errno);                                                          \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

static const size_t PAGE = 4096;

// A store in memory: the bytes are a function of the offset until written.
class MemStore : public Umap::Store {
 public:
  explicit MemStore(size_t len, long fail_at = -1) : data_(len), fail_at_(fail_at) {
    for (size_t i = 0; i < len; i++) data_[i] = (char)(i * 3 + i / PAGE);
  }
  ssize_t read_from_store(char* buf, std::size_t nb, off_t off) override {
    if (fail_at_ >= 0 && (size_t)off <= (size_t)fail_at_ && (size_t)fail_at_ < (size_t)off + nb) {
      errno = EIO;
      return -1;
    }
    std::lock_guard<std::mutex> g(lock_);
    reads++;
    std::memcpy(buf, data_.data() + off, nb);
    return (ssize_t)nb;
  }
  ssize_t write_to_store(char* buf, std::size_t nb, off_t off) override {
    std::lock_guard<std::mutex> g(lock_);
    writes++;
    std::memcpy(data_.data() + off, buf, nb);
    return (ssize_t)nb;
  }
  std::vector<char> data_;
  long fail_at_;
  std::mutex lock_;
  int reads = 0, writes = 0;
};

static int custom_store() {
  const size_t len = 64 * PAGE;
  MemStore store(len);
  char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, -1, 0, &store);
  CHECK(p != UMAP_FAILED);
  for (size_t i = 0; i < len; i += 101) CHECK(p[i] == (char)(i * 3 + i / PAGE));
  CHECK(store.reads > 0);
  p[5 * PAGE + 1] = 42;
  CHECK(umap_flush() == 0);
  CHECK(store.data_[5 * PAGE + 1] == 42 && store.writes >= 1);
  p[9 * PAGE] = 43;
  CHECK(uunmap(p, len) == 0);
  CHECK(store.data_[9 * PAGE] == 43);
  return 0;
}

static int file_store(const char* path) {
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  size_t len = (size_t)lseek(fd, 0, SEEK_END);
  Umap::Store* store = Umap::Store::make_store(nullptr, len, PAGE, fd);
  char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0, store);
  CHECK(p != UMAP_FAILED);
  std::vector<char> want(len);
  CHECK(pread(fd, want.data(), len, 0) == (ssize_t)len);
  CHECK(std::memcmp(p, want.data(), len) == 0);
  p[PAGE + 7] = 99;
  CHECK(uunmap(p, len) == 0);
  char b;
  CHECK(pread(fd, &b, 1, PAGE + 7) == 1 && b == 99);
  delete store;
  close(fd);
  return 0;
}

// A store that fails at page 5: SIGBUS on access, never zeros.
static int failing_store() {
  const size_t len = 16 * PAGE;
  MemStore store(len, 5 * PAGE);
  volatile char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ, UMAP_PRIVATE, -1, 0, &store);
  CHECK(p != UMAP_FAILED);
  CHECK(p[4 * PAGE] == (char)(4 * PAGE * 3 + 4));
  std::printf("reading the failing page\n");
  std::fflush(stdout);
  char v = p[5 * PAGE + 3];
  std::printf("read %d from a page whose store failed\n", v);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  int rc = 2;
  if (mode == "custom") rc = custom_store();
  else if (mode == "file" && argc > 2) rc = file_store(argv[2]);
  else if (mode == "failing") rc = failing_store();
  if (rc == 0) std::printf("ok %s\n", mode.c_str());
  return rc;
}
