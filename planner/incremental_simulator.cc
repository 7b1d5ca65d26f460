#include "planner/incremental_simulator.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

namespace mutwo::planner {
namespace {

constexpr int64_t kPadding = std::numeric_limits<int64_t>::min() / 4;

}  // namespace

bool IncrementalSimulator::Contribution::operator==(
    const Contribution& o) const {
  if (count != o.count) return false;
  for (int i = 0; i < count; ++i) {
    if (begin[i] != o.begin[i] || end[i] != o.end[i] || bytes[i] != o.bytes[i])
      return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<IncrementalSimulator>>
IncrementalSimulator::Create(const Simulator* simulator) {
  if (simulator == nullptr) {
    return absl::InvalidArgumentError("IncrementalSimulator needs a simulator");
  }
  auto inc = std::unique_ptr<IncrementalSimulator>(
      new IncrementalSimulator(simulator));
  inc->Reset();
  return inc;
}

IncrementalSimulator::IncrementalSimulator(const Simulator* simulator)
    : sim_(simulator), prof_(&simulator->profile()) {
  positions_ = sim_->positions();
  while (tree_size_ < positions_) tree_size_ *= 2;
  const int a_count = static_cast<int>(prof_->activations.size());
  const int n = static_cast<int>(prof_->nodes.size());
  users_.resize(a_count);
  for (int a = 0; a < a_count; ++a) {
    for (int s : prof_->activations[a].recompute_sources) {
      if (users_[s].empty() || users_[s].back() != a) users_[s].push_back(a);
    }
  }
  k_of_node_.assign(n, -1);
  for (int node : sim_->op_nodes()) {
    if (sim_->produced_by(node).empty()) continue;
    k_of_node_[node] = static_cast<int>(node_of_k_.size());
    node_of_k_.push_back(node);
  }
  dirty_stamp_.assign(a_count, 0);
  hold_stamp_.assign(a_count, 0);
  node_stamp_.assign(n, 0);
}

void IncrementalSimulator::Reset() {
  const int a_count = static_cast<int>(prof_->activations.size());
  const int k_count = static_cast<int>(node_of_k_.size());
  tree_max_.assign(2 * tree_size_, kPadding);
  tree_add_.assign(2 * tree_size_, 0);
  const std::vector<int64_t>& base = sim_->baseline_during_bytes();
  for (int t = 0; t < positions_; ++t) tree_max_[tree_size_ + t] = base[t];
  for (int node = tree_size_ - 1; node >= 1; --node) {
    tree_max_[node] = std::max(tree_max_[2 * node], tree_max_[2 * node + 1]);
  }
  decisions_.assign(a_count, Decision{});
  recompute_count_.assign(k_count, 0);
  run_starts_.clear();
  recompute_ms_valid_ = false;
  run_end_.assign(k_count, -1);
  run_replay_.assign(k_count, -1);
  run_ms_.assign(k_count, 0);
  run_transient_.assign(k_count, 0);
  replay_runs_.assign(positions_, {});
  replay_ms_.assign(positions_, 0);
  seg_key_.assign(a_count, -1);
  hold_.assign(a_count, -1);
  first_need_.assign(a_count, std::numeric_limits<int>::max());
  swap_order_.clear();
  offload_done_ms_.assign(a_count, 0);
  offload_done_at_.assign(a_count, -1);
  prefetch_at_.assign(a_count, -1);
  swaps_needed_at_.assign(positions_, {});
  registered_need_.assign(a_count, -1);
  applied_.assign(a_count, Contribution{});
}

void IncrementalSimulator::TreeAdd(int begin, int end, int64_t bytes) {
  if (begin > end || bytes == 0) return;
  TreeAdd(1, 0, tree_size_ - 1, begin, end, bytes);
}

void IncrementalSimulator::TreeAdd(int node, int lo, int hi, int begin, int end,
                                   int64_t bytes) {
  if (begin <= lo && hi <= end) {
    tree_max_[node] += bytes;
    tree_add_[node] += bytes;
    return;
  }
  const int mid = (lo + hi) / 2;
  if (begin <= mid) TreeAdd(2 * node, lo, mid, begin, end, bytes);
  if (end > mid) TreeAdd(2 * node + 1, mid + 1, hi, begin, end, bytes);
  tree_max_[node] =
      std::max(tree_max_[2 * node], tree_max_[2 * node + 1]) + tree_add_[node];
}

int64_t IncrementalSimulator::peak_bytes() const { return tree_max_[1]; }

int IncrementalSimulator::peak_position() const {
  int node = 1;
  int64_t target = tree_max_[1];
  while (node < tree_size_) {
    target -= tree_add_[node];
    node = tree_max_[2 * node] == target ? 2 * node : 2 * node + 1;
  }
  return node - tree_size_;
}

int64_t IncrementalSimulator::planned_peak_bytes(int position) const {
  int node = tree_size_ + position;
  int64_t bytes = tree_max_[node];
  for (node >>= 1; node >= 1; node >>= 1) bytes += tree_add_[node];
  return bytes;
}

int IncrementalSimulator::needed_at(int activation) const {
  const Action action = decisions_[activation].action;
  if (action == Action::kRecompute && seg_key_[activation] >= 0) {
    return run_replay_[seg_key_[activation]];
  }
  if (action == Action::kSwap) {
    return std::min(prof_->activations[activation].first_backward_use,
                    first_need_[activation]);
  }
  return -1;
}

int IncrementalSimulator::offload_done_at(int activation) const {
  return decisions_[activation].action == Action::kSwap
             ? offload_done_at_[activation]
             : -1;
}

double IncrementalSimulator::recompute_ms() const {
  if (!recompute_ms_valid_) {
    double total = 0;
    for (int start : run_starts_) total += run_ms_[start];
    recompute_ms_ = total;
    recompute_ms_valid_ = true;
  }
  return recompute_ms_;
}

double IncrementalSimulator::iteration_ms() const {
  const double stall_ms = 0;
  return sim_->baseline_iteration_ms() + recompute_ms() + stall_ms;
}

void IncrementalSimulator::MarkDirty(int a) {
  if (dirty_stamp_[a] == stamp_) return;
  dirty_stamp_[a] = stamp_;
  dirty_.push_back(a);
}

void IncrementalSimulator::MarkHoldDirty(int a) {
  if (hold_stamp_[a] == stamp_) return;
  hold_stamp_[a] = stamp_;
  hold_dirty_.push_back(a);
}

void IncrementalSimulator::MarkSourcesHoldDirty(int a) {
  for (int s : prof_->activations[a].recompute_sources) MarkHoldDirty(s);
}

int IncrementalSimulator::RunContaining(int k) const {
  auto it = std::upper_bound(run_starts_.begin(), run_starts_.end(), k);
  return *std::prev(it);
}

void IncrementalSimulator::UpdateReplayMs(int position) {
  // Summed in segment order from 0, as Simulator::Run's replays are.
  double ms = 0;
  for (int start : replay_runs_[position]) ms += run_ms_[start];
  replay_ms_[position] = ms;
}

void IncrementalSimulator::DetachRun(int start) {
  run_starts_.erase(
      std::lower_bound(run_starts_.begin(), run_starts_.end(), start));
  recompute_ms_valid_ = false;
  const int at = run_replay_[start];
  std::vector<int>& runs = replay_runs_[at];
  runs.erase(std::find(runs.begin(), runs.end(), start));
  UpdateReplayMs(at);
  if (at < positions_) TreeAdd(at, at, -run_transient_[start]);
  run_transient_[start] = 0;
}

void IncrementalSimulator::AttachRun(int start, int end) {
  // The same traversal as Simulator::Run: nodes in order, each node's
  // RECOMPUTE activations, producer then recompute nodes, each node once.
  if (++node_stamp_counter_ == 0) {
    std::fill(node_stamp_.begin(), node_stamp_.end(), 0);
    node_stamp_counter_ = 1;
  }
  const uint32_t stamp = node_stamp_counter_;
  int replay_at = std::numeric_limits<int>::max();
  std::vector<std::pair<int, int64_t>> members;
  std::vector<int> nodes;
  for (int k = start; k <= end; ++k) {
    for (int a : sim_->produced_by(node_of_k_[k])) {
      if (decisions_[a].action != Action::kRecompute) continue;
      const PlanActivation& act = prof_->activations[a];
      seg_key_[a] = start;
      members.push_back({act.producer_node, act.size_bytes});
      replay_at = std::min(replay_at, act.first_backward_use);
      if (node_stamp_[act.producer_node] != stamp) {
        node_stamp_[act.producer_node] = stamp;
        nodes.push_back(act.producer_node);
      }
      for (int rn : act.recompute_nodes) {
        if (node_stamp_[rn] != stamp) {
          node_stamp_[rn] = stamp;
          nodes.push_back(rn);
        }
      }
      MarkDirty(a);
      MarkHoldDirty(a);
      MarkSourcesHoldDirty(a);
    }
  }
  std::sort(nodes.begin(), nodes.end());
  const double ms = sim_->ReplayMs(nodes);
  run_starts_.insert(
      std::lower_bound(run_starts_.begin(), run_starts_.end(), start), start);
  recompute_ms_valid_ = false;
  run_end_[start] = end;
  run_replay_[start] = replay_at;
  run_ms_[start] = ms;
  run_transient_[start] =
      replay_at < positions_
          ? sim_->replay_transient_excess(sim_->ReplayTransient(members, nodes),
                                          replay_at)
          : 0;
  if (replay_at < positions_) {
    TreeAdd(replay_at, replay_at, run_transient_[start]);
  }
  std::vector<int>& runs = replay_runs_[replay_at];
  runs.insert(std::lower_bound(runs.begin(), runs.end(), start), start);
  UpdateReplayMs(replay_at);
}

void IncrementalSimulator::UpdateOffloads(
    std::set<std::pair<int, int>>::iterator from, int forced) {
  double d2h_free = from == swap_order_.begin()
                        ? 0
                        : offload_done_ms_[std::prev(from)->second];
  const std::vector<double>& end_ms = sim_->baseline_end_times_ms();
  for (auto it = from; it != swap_order_.end(); ++it) {
    const int a = it->second;
    const PlanActivation& act = prof_->activations[a];
    const double start = std::max(end_ms[act.last_forward_use], d2h_free);
    const double done = start + sim_->transfer_out_ms(act);
    if (a != forced && done == offload_done_ms_[a]) break;
    d2h_free = done;
    offload_done_ms_[a] = done;
    auto pos = std::lower_bound(end_ms.begin() + act.last_forward_use,
                                end_ms.end(), done);
    offload_done_at_[a] = pos == end_ms.end()
                              ? positions_ - 1
                              : static_cast<int>(pos - end_ms.begin());
    MarkDirty(a);
  }
}

void IncrementalSimulator::Set(int a, Decision d) {
  const Decision old = decisions_[a];
  if (old.action == d.action && old.prefetch_at == d.prefetch_at) return;
  decisions_[a] = d;
  if (++stamp_ == 0) {
    std::fill(dirty_stamp_.begin(), dirty_stamp_.end(), 0);
    std::fill(hold_stamp_.begin(), hold_stamp_.end(), 0);
    stamp_ = 1;
  }
  dirty_.clear();
  hold_dirty_.clear();
  const PlanActivation& act = prof_->activations[a];
  MarkDirty(a);
  MarkHoldDirty(a);
  MarkSourcesHoldDirty(a);

  // Segments.
  const bool was_r = old.action == Action::kRecompute;
  const bool is_r = d.action == Action::kRecompute;
  const int k = k_of_node_[act.producer_node];
  if (was_r != is_r && k >= 0) {
    const int k_count = static_cast<int>(node_of_k_.size());
    if (!is_r) seg_key_[a] = -1;
    const int before = recompute_count_[k];
    recompute_count_[k] += is_r ? 1 : -1;
    if (before > 0 && recompute_count_[k] > 0) {
      // Another activation of the node keeps it in its segment.
      const int start = RunContaining(k);
      DetachRun(start);
      AttachRun(start, run_end_[start]);
    } else if (is_r) {
      int start = k, end = k;
      if (k > 0 && recompute_count_[k - 1] > 0) {
        start = RunContaining(k - 1);
        DetachRun(start);
      }
      if (k + 1 < k_count && recompute_count_[k + 1] > 0) {
        end = run_end_[k + 1];
        DetachRun(k + 1);
      }
      AttachRun(start, end);
    } else {
      const int start = RunContaining(k);
      const int end = run_end_[start];
      DetachRun(start);
      if (start < k) AttachRun(start, k - 1);
      if (k < end) AttachRun(k + 1, end);
    }
  }

  // The device->host queue.
  const bool was_s = old.action == Action::kSwap;
  const bool is_s = d.action == Action::kSwap;
  if (was_s && !is_s) {
    auto it = swap_order_.find({act.last_forward_use, a});
    it = swap_order_.erase(it);
    UpdateOffloads(it, -1);
  } else if (is_s && !was_s) {
    auto it = swap_order_.insert({act.last_forward_use, a}).first;
    UpdateOffloads(it, a);
  }

  // Segment inputs are held until the latest replay that uses them.
  for (size_t i = 0; i < hold_dirty_.size(); ++i) {
    const int x = hold_dirty_[i];
    int hold = -1, first_need = std::numeric_limits<int>::max();
    for (int u : users_[x]) {
      const int key = seg_key_[u];
      if (key < 0 || key == seg_key_[x]) continue;
      hold = std::max(hold, run_replay_[key]);
      first_need = std::min(first_need, run_replay_[key]);
    }
    if (hold != hold_[x] || first_need != first_need_[x]) {
      hold_[x] = hold;
      first_need_[x] = first_need;
      MarkDirty(x);
    }
  }

  for (size_t i = 0; i < dirty_.size(); ++i) {
    const int x = dirty_[i];
    const Contribution next = Derive(x);
    Contribution& applied = applied_[x];
    if (next == applied) continue;
    for (int j = 0; j < applied.count; ++j) {
      TreeAdd(applied.begin[j], applied.end[j], -applied.bytes[j]);
    }
    for (int j = 0; j < next.count; ++j) {
      TreeAdd(next.begin[j], next.end[j], next.bytes[j]);
    }
    applied = next;
  }
}

IncrementalSimulator::Contribution IncrementalSimulator::Derive(int x) {
  Contribution c;
  const Action action = decisions_[x].action;
  const PlanActivation& act = prof_->activations[x];
  const int64_t s = act.size_bytes;
  int need = -1;
  if (action == Action::kSwap) {
    need = std::min(act.first_backward_use, first_need_[x]);
    int pa = decisions_[x].prefetch_at;
    if (pa < 0 || pa > need) pa = need;
    pa = prof_->IssuePosition(pa);
    if (pa <= act.last_forward_use) pa = act.last_forward_use + 1;
    prefetch_at_[x] = pa;
  }
  if (need != registered_need_[x]) {
    if (registered_need_[x] >= 0) {
      std::vector<int>& listed = swaps_needed_at_[registered_need_[x]];
      listed.erase(std::find(listed.begin(), listed.end(), x));
    }
    if (need >= 0) swaps_needed_at_[need].push_back(x);
    registered_need_[x] = need;
  }
  if ((action == Action::kRetain && hold_[x] < 0) || s == 0) return c;
  const int last = positions_ - 1;
  const int end = std::max(act.last_backward_use, hold_[x]);
  int release_after = -1, back_at = -1;
  if (action == Action::kRecompute && seg_key_[x] >= 0) {
    release_after = std::max(act.last_forward_use, hold_[x]);
    back_at = run_replay_[seg_key_[x]];
  } else if (action == Action::kSwap) {
    release_after = offload_done_at_[x];
    back_at = prefetch_at_[x];
  }
  // The simulator's intervals as difference events over positions [b, e]
  // (clipped to the timeline), then swept into maximal constant runs.
  std::pair<int, int64_t> events[6];
  int n = 0;
  auto add = [&](int b, int e, int64_t bytes) {
    if (e > last) e = last;
    if (b > e) return;
    events[n++] = {b, bytes};
    events[n++] = {e + 1, -bytes};
  };
  add(act.producer_node, act.last_backward_use, -s);
  if (release_after >= 0 && release_after + 1 < back_at) {
    add(act.producer_node, release_after, s);
    add(back_at, end, s);
  } else {
    add(act.producer_node, end, s);
  }
  std::sort(events, events + n,
            [](const auto& x, const auto& y) { return x.first < y.first; });
  int64_t value = 0;
  for (int i = 0; i < n;) {
    const int at = events[i].first;
    for (; i < n && events[i].first == at; ++i) value += events[i].second;
    if (value != 0 && i < n) {
      c.begin[c.count] = at;
      c.end[c.count] = events[i].first - 1;
      c.bytes[c.count] = value;
      ++c.count;
    }
  }
  return c;
}

}  // namespace mutwo::planner
