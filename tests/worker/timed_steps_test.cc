// TrainingState's timed steps: what is timed, in which order, and which
// median goes where.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/training_setup.h"

namespace mutwo::worker {
namespace {

// A device whose clock advances only by what the steps say they took, and
// whose peak is what they say they allocated.
class ClockBackend : public DeviceBackend {
 public:
  double now_ms = 0;
  int64_t peak = 0;
  std::vector<double> marks;

  std::string kind() const override { return "cpu"; }
  int64_t AllocatedBytes() override { return 0; }
  int64_t PeakBytes() override { return peak; }
  void ResetPeak() override { peak = 0; }
  void Synchronize() override {}
  bool SupportsTracking() const override { return false; }
  void SetTag(int64_t) override {}
  std::vector<LiveBlock> LiveBlocks() override { return {}; }
  void StartFreeLog() override {}
  std::vector<FreeEvent> StopFreeLog() override { return {}; }
  int Mark() override {
    marks.push_back(now_ms);
    return static_cast<int>(marks.size()) - 1;
  }
  double ElapsedMs(int from, int to) override {
    return marks[to] - marks[from];
  }
  void ClearMarks() override { marks.clear(); }
  v1::DeviceInfo Describe() override { return {}; }
};

struct Fixture {
  TrainingState state;
  ClockBackend* clock = nullptr;
  std::string order;  // "a" or "b" per step run

  Fixture() {
    auto backend = std::make_unique<ClockBackend>();
    clock = backend.get();
    state.backend = std::move(backend);
  }
  // A step that takes `ms` (plus the host's drift `drift` per step run so
  // far) and peaks at `bytes`.
  std::function<absl::Status()> Step(char name, double ms, int64_t bytes,
                                     double drift) {
    return [this, name, ms, bytes, drift]() {
      clock->now_ms += ms + drift * static_cast<double>(order.size());
      clock->peak = std::max(clock->peak, bytes);
      order.push_back(name);
      return absl::OkStatus();
    };
  }
};

TEST(TimedStepsTest, TheMedianOfTheMeasuredStepsAfterTheWarmUp) {
  Fixture f;
  double ms = 0;
  int64_t peak = 0;
  // Steps take 10, 10+5, 10+10, ... ms: the warm-up's 2 are not counted,
  // the median of the next 3 (20, 25, 30) is 25.
  ASSERT_TRUE(
      f.state.TimedSteps(2, 3, f.Step('a', 10, 64, 5), &ms, &peak).ok());
  EXPECT_EQ(f.order, "aaaaa");
  EXPECT_DOUBLE_EQ(ms, 25);
  EXPECT_EQ(peak, 64);
}

TEST(TimedStepsTest, APairIsTimedInTurnsSoThatADriftFallsOnBoth) {
  Fixture f;
  double ms[2] = {0, 0};
  int64_t peak[2] = {0, 0};
  // The host gets slower by 1 ms per step run. Timed one after the other
  // (4 of a, then 4 of b), b would measure 4 ms more than a from the drift
  // alone; in turns, with the order swapped every round, the drift falls
  // on both alike.
  ASSERT_TRUE(f.state
                  .TimedStepPair(1, 4, f.Step('a', 10, 100, 1),
                                 f.Step('b', 10, 40, 1), ms, peak)
                  .ok());
  EXPECT_EQ(f.order,
            "ab"
            "ba"
            "ab"
            "ba"
            "ab");
  EXPECT_NEAR(ms[0], ms[1], 0.5 + 1e-9);
  EXPECT_EQ(peak[0], 100);
  EXPECT_EQ(peak[1], 40);
}

TEST(TimedStepsTest, EachStepOfAPairGetsItsOwnMedianAndPeak) {
  Fixture f;
  double ms[2] = {0, 0};
  int64_t peak[2] = {0, 0};
  ASSERT_TRUE(f.state
                  .TimedStepPair(2, 3, f.Step('a', 7, 10, 0),
                                 f.Step('b', 11, 20, 0), ms, peak)
                  .ok());
  EXPECT_EQ(f.order.size(), 10u);
  EXPECT_DOUBLE_EQ(ms[0], 7);
  EXPECT_DOUBLE_EQ(ms[1], 11);
  EXPECT_EQ(peak[0], 10);
  EXPECT_EQ(peak[1], 20);
}

TEST(TimedStepsTest, AFailingStepEndsTheTiming) {
  Fixture f;
  double ms[2] = {0, 0};
  int64_t peak[2] = {0, 0};
  const absl::Status status = f.state.TimedStepPair(
      1, 3, f.Step('a', 1, 1, 0),
      []() { return absl::InvalidArgumentError("forward: bad shape"); }, ms,
      peak);
  EXPECT_EQ(status.message(), "forward: bad shape");
  EXPECT_EQ(f.order, "a");
}

}  // namespace
}  // namespace mutwo::worker
