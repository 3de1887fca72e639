// Asserting an error: its category (core/status.h) and a fragment of its message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/status.h"

namespace kiln::testing {

inline void expect_error(const Status& s, ErrorCode code, const std::string& fragment) {
  ASSERT_FALSE(s.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

}  // namespace kiln::testing
