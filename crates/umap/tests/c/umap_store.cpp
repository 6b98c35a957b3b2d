// Umap::Store plug-ins through Umap::umap_ex; run by tests/umap_c.rs.
// usage: umap_store MODE [FILE]; prints "ok MODE" on success.
#include <umap/umap.h>
#include <umap/store/SparseStore.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>
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

// UMap's SparseStore: a region of 24 pages over files of 5 pages (4 KiB
// UMap pages) in a new directory. Writes every page, unmaps, closes; the
// files 0..4 (created on demand, preallocated to 5 pages) and _metadata
// (file size, capacity) exist; opened again read-only, every byte reads
// back; get_capacity agrees; creating over an existing directory throws.
static int sparse_store(const char* dir) {
  const size_t pages = 24, len = pages * PAGE, file_size = 5 * PAGE;
  auto byte = [](size_t i) { return (char)(i * 7 + i / PAGE * 13 + 1); };
  {
    Umap::SparseStore store(len, PAGE, dir, file_size);
    CHECK(store.get_current_capacity() == len);
    char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, -1, 0, &store);
    CHECK(p != UMAP_FAILED);
    // Every page read first (zeros: the files do not exist yet), then
    // written, out of order.
    for (size_t pg = 0; pg < pages; pg++) CHECK(p[pg * PAGE + 9] == 0);
    for (size_t k = 0; k < pages; k++) {
      size_t pg = (k * 7) % pages;
      for (size_t i = pg * PAGE; i < (pg + 1) * PAGE; i++) p[i] = byte(i);
    }
    CHECK(uunmap(p, len) == 0);
    CHECK(store.close_files() == 0);
  }
  struct stat st;
  for (int f = 0; f < 5; f++) {
    std::string path = std::string(dir) + "/" + std::to_string(f);
    CHECK(stat(path.c_str(), &st) == 0);
    CHECK((size_t)st.st_size == file_size);
  }
  CHECK(stat((std::string(dir) + "/5").c_str(), &st) != 0);
  FILE* m = std::fopen((std::string(dir) + "/_metadata").c_str(), "r");
  CHECK(m != nullptr);
  unsigned long fs = 0, cap = 0;
  CHECK(std::fscanf(m, "%lu %lu", &fs, &cap) == 2);
  std::fclose(m);
  CHECK(fs == file_size && cap == len);
  CHECK(Umap::SparseStore::get_capacity(dir) == len);
  {
    Umap::SparseStore store(dir, true);
    char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ, UMAP_PRIVATE, -1, 0, &store);
    CHECK(p != UMAP_FAILED);
    for (size_t i = 0; i < len; i++) CHECK(p[i] == byte(i));
    CHECK(uunmap(p, len) == 0);
  }
  bool threw = false;
  try {
    Umap::SparseStore again(len, PAGE, dir, file_size);
  } catch (const std::system_error& e) {
    threw = e.code().value() == EEXIST;
  }
  CHECK(threw);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  int rc = 2;
  if (mode == "custom") rc = custom_store();
  else if (mode == "file" && argc > 2) rc = file_store(argv[2]);
  else if (mode == "failing") rc = failing_store();
  else if (mode == "sparse" && argc > 2) rc = sparse_store(argv[2]);
  if (rc == 0) std::printf("ok %s\n", mode.c_str());
  return rc;
}
