// Confined, non-blocking file access (core/file_access.h): symlinks to files and folders, hard
// links, `..` in the location and in the folder's own path, FIFOs, devices and directories, with
// openat2 and with the /proc/self/fd check used where openat2 is missing.
#include "core/file_access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace kiln {
namespace {

namespace fs = std::filesystem;

class FileAccess : public ::testing::TestWithParam<bool> {  // param: force the /proc check
 protected:
  void SetUp() override {
    force_proc_fd_confinement_for_testing(GetParam());
    root_ = fs::temp_directory_path() / ("kiln_file_access_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "model" / "sub");
    fs::create_directories(root_ / "outside");
    write(root_ / "model" / "w.bin", "inside");
    write(root_ / "model" / "sub" / "w2.bin", "inside2");
    write(root_ / "outside" / "secret.bin", "secret");
    fs::create_symlink("../outside/secret.bin", root_ / "model" / "link_file");
    fs::create_symlink(root_ / "outside" / "secret.bin", root_ / "model" / "abs_link_file");
    fs::create_symlink("../outside", root_ / "model" / "link_dir");
    fs::create_symlink("sub/w2.bin", root_ / "model" / "inside_link");
    fs::create_symlink("model", root_ / "model_link");  // the folder itself reached through a symlink
    fs::create_hard_link(root_ / "outside" / "secret.bin", root_ / "model" / "hard");
    ASSERT_EQ(::mkfifo((root_ / "model" / "fifo").c_str(), 0600), 0);
  }
  void TearDown() override {
    force_proc_fd_confinement_for_testing(false);
    fs::remove_all(root_);
  }
  static void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
  std::string dir() const { return (root_ / "model").string(); }
  static std::string content(OpenedFile& f) {
    std::string s(f.size, '\0');
    EXPECT_TRUE(read_at(f.fd.get(), s.data(), s.size(), 0, "test").ok());
    return s;
  }
  Result<OpenedFile> open(const std::string& folder, const std::string& loc, bool allow = false) {
    return open_inside(folder, loc, allow, "external data '" + loc + "' of initializer 'w'");
  }
  void expect_outside(const std::string& folder, const std::string& loc) {
    auto r = open(folder, loc);
    ASSERT_FALSE(r.ok()) << loc << " was opened";
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidModel) << r.status().to_string();
    EXPECT_NE(r.status().message().find("resolves outside the model's folder"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("--allow-external-data-outside"), std::string::npos);
  }
  fs::path root_;
};

TEST_P(FileAccess, OpensFilesInsideTheFolder) {
  for (const char* loc : {"w.bin", "sub/w2.bin", "sub/../w.bin", "./sub/./w2.bin", "inside_link"}) {
    auto r = open(dir(), loc);
    ASSERT_TRUE(r.ok()) << loc << ": " << r.status().to_string();
    EXPECT_EQ(content(r.value()).substr(0, 6), "inside") << loc;
  }
  // `..` in the folder's own path, and the folder reached through a symlink: the folder is what
  // the path resolves to, and files inside it are inside.
  for (const std::string folder : {dir() + "/sub/..", (root_ / "model_link").string(), dir() + "/../model"}) {
    auto r = open(folder, "w.bin");
    ASSERT_TRUE(r.ok()) << folder << ": " << r.status().to_string();
    EXPECT_EQ(content(r.value()), "inside");
  }
}

TEST_P(FileAccess, RefusesEveryWayOut) {
  expect_outside(dir(), "link_file");              // symlink to a file outside
  expect_outside(dir(), "abs_link_file");          // absolute symlink
  expect_outside(dir(), "link_dir/secret.bin");    // symlinked folder
  expect_outside(dir(), "../outside/secret.bin");  // `..` in the location
  expect_outside(dir(), "sub/../../outside/secret.bin");
  expect_outside(dir(), (root_ / "outside" / "secret.bin").string());  // absolute location
  expect_outside(dir() + "/sub/..", "../outside/secret.bin");          // `..` in both
  expect_outside(dir() + "/sub", "../link_file");  // out of sub/ into model/ is outside sub/ already
}

TEST_P(FileAccess, HardLinksAreInsideByDefinition) {
  // A hard link is an entry of the folder: the kernel cannot tell it from the "original" name, and
  // making one needs write access to the folder (documented in file_access.h).
  auto r = open(dir(), "hard");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(content(r.value()), "secret");
}

TEST_P(FileAccess, AllowOutsideLiftsTheConfinement) {
  for (const char* loc : {"link_file", "link_dir/secret.bin", "../outside/secret.bin"}) {
    auto r = open(dir(), loc, /*allow=*/true);
    ASSERT_TRUE(r.ok()) << loc << ": " << r.status().to_string();
    EXPECT_EQ(content(r.value()), "secret");
  }
}

TEST_P(FileAccess, FifoDirectoryAndDeviceAreNamedErrorsWithoutBlocking) {
  auto f = open(dir(), "fifo");  // a plain open() of a FIFO nobody writes to blocks forever
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ErrorCode::kInvalidModel);
  EXPECT_NE(f.status().message().find("external data 'fifo' of initializer 'w' is a FIFO"), std::string::npos)
      << f.status().message();
  auto d = open(dir(), "sub");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("external data 'sub' of initializer 'w' is a directory"), std::string::npos)
      << d.status().message();
  auto m = open(dir(), "missing.bin");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.status().message().find("does not exist"), std::string::npos);

  auto fifo = open_regular_file((root_ / "model" / "fifo").string(), "input file 'x'");
  ASSERT_FALSE(fifo.ok());
  EXPECT_EQ(fifo.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(fifo.status().message().find("input file 'x' is a FIFO"), std::string::npos);
  auto dev = open_regular_file("/dev/null");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("'/dev/null' is a character device"), std::string::npos);
  auto reg = open_regular_file((root_ / "model" / "w.bin").string());
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg.value().size, 6u);
}

INSTANTIATE_TEST_SUITE_P(Openat2AndProcFd, FileAccess, ::testing::Values(false, true));

}  // namespace
}  // namespace kiln
