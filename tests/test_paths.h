// Where tests find the project's shared assets (../shared beside the repository: released configs,
// checkpoint census, goldens) and the built ds41 binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ds41::test {

inline std::string shared_dir() {
  if (const char* env = std::getenv("DS41_SHARED_DIR")) return env;
  return (std::filesystem::path(DS41_SOURCE_DIR) / ".." / "shared").lexically_normal().string();
}
inline bool have_shared() { return std::filesystem::is_directory(shared_dir() + "/assets"); }
inline std::string ds41_binary() { return DS41_BINARY; }

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ds41-test-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& leaf) const { return path_ + "/" + leaf; }

 private:
  std::string path_;
};

}  // namespace ds41::test
