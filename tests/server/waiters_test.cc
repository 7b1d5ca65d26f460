// WaiterSet: waiters woken by changes, deadlines, cancellation and shutdown
// without a thread each, and refused past their limit with a retry hint.
#include "server/waiters.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace mutwo {
namespace {

using Why = WaiterSet::Why;

// Records its wakes; finishes on any wake but kChanged, or on kChanged once
// `finish_on_change` is set.
class RecordingWaiter : public WaiterSet::Waiter {
 public:
  bool OnWake(Why why) override {
    absl::MutexLock lock(&mu_);
    wakes_.push_back(why);
    if (why == Why::kChanged && !finish_on_change_) return false;
    finished_at_ = std::chrono::steady_clock::now();
    finished_.Notify();
    return true;
  }
  void FinishOnChange() {
    absl::MutexLock lock(&mu_);
    finish_on_change_ = true;
  }
  std::vector<Why> wakes() {
    absl::MutexLock lock(&mu_);
    return wakes_;
  }
  absl::Notification finished_;
  std::chrono::steady_clock::time_point finished_at_;

 private:
  absl::Mutex mu_;
  std::vector<Why> wakes_;
  bool finish_on_change_ = false;
};

std::unique_ptr<WaiterSet> MakeSet(int max_waiters,
                                   std::atomic<int>* waiting = nullptr,
                                   std::atomic<int>* refused = nullptr) {
  WaiterSet::Options options;
  if (waiting != nullptr) {
    options.observe_waiting = [waiting](int n) { *waiting = n; };
  }
  if (refused != nullptr) {
    options.observe_refused = [refused] { ++*refused; };
  }
  options.what = "lease polls";
  options.flag = "--max_lease_waiters";
  options.max_waiters = max_waiters;
  options.retry_after_ms = 700;
  auto set = WaiterSet::Create(options);
  EXPECT_TRUE(set.ok()) << set.status();
  return *std::move(set);
}

TEST(WaiterSetTest, CancelledWaiterIsRemovedAtOnce) {
  auto set = MakeSet(10);
  RecordingWaiter w;
  auto id = set->Add(&w, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto cancelled_at = std::chrono::steady_clock::now();
  set->Wake(*id, Why::kCancelled);
  ASSERT_TRUE(w.finished_.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_LT(w.finished_at_ - cancelled_at, std::chrono::milliseconds(100));
  EXPECT_EQ(w.wakes().back(), Why::kCancelled);
  // Forgotten: its place is free again.
  for (int i = 0; i < 50 && set->size() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(set->size(), 0);
}

TEST(WaiterSetTest, NotifyWakesEveryWaiterAndTheDeadlineEndsTheWait) {
  auto set = MakeSet(10);
  RecordingWaiter a, b;
  ASSERT_TRUE(set->Add(&a, absl::Now() + absl::Seconds(30)).ok());
  ASSERT_TRUE(set->Add(&b, absl::Now() + absl::Milliseconds(300)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  a.FinishOnChange();
  set->Notify();
  ASSERT_TRUE(a.finished_.WaitForNotificationWithTimeout(absl::Seconds(1)));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(b.finished_.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_EQ(b.wakes().back(), Why::kDeadline);
  EXPECT_LT(b.finished_at_ - start, std::chrono::milliseconds(400));
}

TEST(WaiterSetTest, BeyondTheLimitIsRefusedWithARetryHint) {
  std::atomic<int> waiting{0}, refusals{0};
  auto set = MakeSet(2, &waiting, &refusals);
  RecordingWaiter a, b, c;
  ASSERT_TRUE(set->Add(&a, absl::InfiniteFuture()).ok());
  ASSERT_TRUE(set->Add(&b, absl::InfiniteFuture()).ok());
  auto refused = set->Add(&c, absl::InfiniteFuture());
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status()));
  EXPECT_EQ(refused.status().message(),
            "lease polls: 2 open, the limit (--max_lease_waiters); retry in "
            "700 ms");
  EXPECT_EQ(WaiterSet::RetryAfterMs(refused.status()), 700);
  EXPECT_EQ(WaiterSet::RetryAfterMs(absl::InternalError("x")), std::nullopt);
  // What the metrics see (mutwo_long_waits, ..._refused_total).
  EXPECT_EQ(waiting.load(), 2);
  EXPECT_EQ(refusals.load(), 1);
  set->Shutdown();
  EXPECT_EQ(waiting.load(), 0);
  EXPECT_EQ(a.wakes().back(), Why::kShutdown);
  EXPECT_EQ(b.wakes().back(), Why::kShutdown);
  EXPECT_TRUE(
      absl::IsUnavailable(set->Add(&c, absl::InfiniteFuture()).status()));
}

// A waiter that cannot finish yet (a write in flight) is not spun on: it is
// told again only when woken.
TEST(WaiterSetTest, AWaiterThatCannotFinishYetIsNotSpunOn) {
  auto set = MakeSet(2);
  class Busy : public WaiterSet::Waiter {
   public:
    bool OnWake(Why why) override {
      ++calls;
      return why != Why::kChanged && ready.load();
    }
    std::atomic<int> calls{0};
    std::atomic<bool> ready{false};
  } busy;
  auto id = set->Add(&busy, absl::InfiniteFuture());
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  set->Wake(*id, Why::kCancelled);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(busy.calls.load(), 3);
  busy.ready = true;
  set->Wake(*id, Why::kChanged);
  for (int i = 0; i < 100 && set->size() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(set->size(), 0);
}

}  // namespace
}  // namespace mutwo
