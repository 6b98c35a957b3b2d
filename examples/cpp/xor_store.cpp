// A Umap::Store plug-in: a file kept scrambled at rest (XOR with a key),
// served unscrambled through Umap::umap_ex; writes are scrambled on the way
// back. The program maps the file, checks it, edits it, and uunmaps.
//
//   xor_store FILE KEY
//
// Build: c++ -O2 xor_store.cpp $(pkg-config --cflags --libs umap)
#include <umap/umap.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <vector>

class XorStore : public Umap::Store {
 public:
  XorStore(int fd, unsigned char key) : fd_(fd), key_(key) {}
  ssize_t read_from_store(char* buf, std::size_t nb, off_t off) override {
    ssize_t got = pread(fd_, buf, nb, off);
    for (ssize_t i = 0; i < got; i++) buf[i] ^= (char)key_;
    return got;  // short at the end of the file: the rest reads as zeros
  }
  ssize_t write_to_store(char* buf, std::size_t nb, off_t off) override {
    std::vector<char> out(buf, buf + nb);
    for (auto& c : out) c ^= (char)key_;
    return pwrite(fd_, out.data(), nb, off);
  }

 private:
  int fd_;
  unsigned char key_;
};

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FILE KEY\n", argv[0]);
    return 2;
  }
  int fd = open(argv[1], O_RDWR);
  if (fd < 0) { std::perror(argv[1]); return 1; }
  struct stat st;
  fstat(fd, &st);
  std::size_t len = ((std::size_t)st.st_size + 4095) & ~(std::size_t)4095;
  XorStore store(fd, (unsigned char)std::atoi(argv[2]));
  char* p = (char*)Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0, &store);
  if (p == UMAP_FAILED) { std::fprintf(stderr, "umap_ex: %s\n", std::strerror(errno)); return 1; }
  std::printf("first bytes: %.16s\n", p);
  for (std::size_t i = 0; i + 1 < (std::size_t)st.st_size; i += 4096) p[i] = (char)std::toupper(p[i]);
  if (uunmap(p, len) != 0) { std::perror("uunmap"); return 1; }
  std::printf("capitalised the first byte of every page\n");
  return 0;
}
