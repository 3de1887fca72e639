#include "core/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kiln {
namespace {

TEST(MappedFile, MapsARegularFile) {
  std::string path = ::testing::TempDir() + "kiln_mapped_file_test.bin";
  std::string content(100000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7);
  std::ofstream(path, std::ios::binary) << content;
  auto m = MappedFile::open(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m.value()->mapped());
  EXPECT_EQ(m.value()->view(), content);
  std::remove(path.c_str());
}

TEST(MappedFile, EmptyFileIsReadAndAPipeIsANamedError) {
  std::string path = ::testing::TempDir() + "kiln_mapped_file_empty.bin";
  { std::ofstream f(path, std::ios::binary); }
  auto m = MappedFile::open(path);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.value()->size(), 0u);
  std::remove(path.c_str());

  // Not a regular file: refused by name (a FIFO nobody writes to would block a plain open forever).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "abc", 3), 3);
  ::close(fds[1]);
  auto p = MappedFile::open("/dev/fd/" + std::to_string(fds[0]));
  ::close(fds[0]);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("is a FIFO (named pipe), not a regular file"), std::string::npos)
      << p.status().message();
}

TEST(MappedFile, ErrorsNameThePath) {
  auto m = MappedFile::open("/nonexistent/kiln.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.status().message().find("/nonexistent/kiln.onnx"), std::string::npos);
  auto d = MappedFile::open("/tmp");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("directory"), std::string::npos);
}

}  // namespace
}  // namespace kiln
