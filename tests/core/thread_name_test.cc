// Thread names (thread_name.h): set, read back, cut at 15 bytes, and given
// back by ScopedThreadName; a thread started inside one inherits it.

#include "granary/core/thread_name.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace granary {
namespace {

TEST(ThreadNameTest, SetReadCutAndRestored) {
  std::string seen, inherited, after;
  std::thread t([&] {
    NameThisThread("worker");
    seen = ThisThreadName();
    {
      ScopedThreadName scoped("a-very-long-thread-name");
      std::thread child([&] { inherited = ThisThreadName(); });
      child.join();
    }
    after = ThisThreadName();
  });
  t.join();
  EXPECT_EQ(seen, "worker");
  EXPECT_EQ(inherited, "a-very-long-thr");  // 15 bytes: what the kernel keeps
  EXPECT_EQ(after, "worker");
}

}  // namespace
}  // namespace granary
