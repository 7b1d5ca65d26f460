#include "planner/lineage.h"

#include <algorithm>
#include <utility>

namespace mutwo::planner {

Lineage::Lineage(const Simulator& sim) : sim_(sim) {
  const PlanProfile& prof = sim.profile();
  const int n = static_cast<int>(prof.activations.size());
  srcs_.resize(n);
  users_.resize(n);
  time_.resize(n);
  total_.resize(n);
  state_.assign(n, State::kCandidate);
  chosen_users_.assign(n, 0);
  for (int c = 0; c < n; ++c) {
    const PlanActivation& a = prof.activations[c];
    srcs_[c] = a.recompute_sources;
    std::sort(srcs_[c].begin(), srcs_[c].end());
    srcs_[c].erase(std::unique(srcs_[c].begin(), srcs_[c].end()),
                   srcs_[c].end());
    for (int s : srcs_[c]) users_[s].push_back(c);
    double t = a.recompute_ms;
    if (t <= 0) {
      t = prof.nodes[a.producer_node].forward_ms;
      for (int node : a.recompute_nodes) {
        if (node != a.producer_node) t += prof.nodes[node].forward_ms;
      }
    }
    time_[c] = t;
    total_[c] = t;
    // Only op nodes are replayed by the executor's segments.
    if (a.size_bytes <= 0 || !a.recomputable ||
        !prof.nodes[a.producer_node].is_op) {
      state_[c] = State::kNever;
    }
  }
}

void Lineage::Forget(int c) {
  if (state_[c] == State::kRecomputed) {
    for (int x : srcs_[c]) --chosen_users_[x];
  }
  state_[c] = State::kNever;
}

void Lineage::Recompute(int t, bool refresh) {
  state_[t] = State::kRecomputed;
  for (int x : srcs_[t]) ++chosen_users_[x];
  // users_[t] is not read again once t is chosen.
  const std::vector<int> users = std::move(users_[t]);
  for (int u : users) {
    if (!HasSource(u, t)) continue;
    if (state_[u] == State::kRecomputed) {
      Replace(u, t);
      time_[u] += time_[t];
    } else if (state_[u] == State::kCandidate) {
      Replace(u, t);
      time_[u] += time_[t];
      if (refresh) RefreshTotal(u);
    }
  }
  if (!refresh) return;
  for (int s : srcs_[t]) {
    if (state_[s] == State::kCandidate) RefreshTotal(s);
  }
}

void Lineage::SwapToRecompute(int t) {
  state_[t] = State::kRecomputed;
  for (int x : srcs_[t]) {
    ++chosen_users_[x];
    if (state_[x] == State::kCandidate) RefreshTotal(x);
  }
}

void Lineage::RefreshAll() {
  for (size_t c = 0; c < state_.size(); ++c) {
    if (state_[c] == State::kCandidate) RefreshTotal(static_cast<int>(c));
  }
}

void Lineage::Swap(int t) {
  state_[t] = State::kSwapped;
  const PlanActivation& ta = sim_.profile().activations[t];
  // users_[t] is not read again once t is chosen.
  const std::vector<int> users = std::move(users_[t]);
  for (int u : users) {
    if (state_[u] != State::kCandidate || !HasSource(u, t)) continue;
    const int fbu = sim_.profile().activations[u].first_backward_use;
    if (fbu >= ta.first_backward_use && fbu <= ta.last_backward_use) {
      continue;
    }
    Replace(u, t);
    time_[u] += time_[t];
    RefreshTotal(u);
  }
}

bool Lineage::HasSource(int u, int s) const {
  return std::binary_search(srcs_[u].begin(), srcs_[u].end(), s);
}

void Lineage::Replace(int u, int t) {
  std::vector<int>& srcs = srcs_[u];
  // Keeps chosen_users_ exact when u is a chosen recomputation: every
  // source it drops or gains changes that source's count.
  const int delta = state_[u] == State::kRecomputed ? 1 : 0;
  merged_.clear();
  auto it = srcs.begin();
  auto keep = [&](int x) { return x != t && state_[x] == State::kCandidate; };
  for (int x : srcs_[t]) {
    if (x == u || !keep(x)) continue;
    for (; it != srcs.end() && *it < x; ++it) {
      if (keep(*it)) {
        merged_.push_back(*it);
      } else {
        chosen_users_[*it] -= delta;
      }
    }
    if (it != srcs.end() && *it == x) continue;
    merged_.push_back(x);
    chosen_users_[x] += delta;
    users_[x].push_back(u);
  }
  for (; it != srcs.end(); ++it) {
    if (keep(*it)) {
      merged_.push_back(*it);
    } else {
      chosen_users_[*it] -= delta;
    }
  }
  srcs.swap(merged_);
}

void Lineage::RefreshTotal(int c) {
  total_[c] = time_[c] * (1 + chosen_users_[c]);
  if (refreshed_ != nullptr) refreshed_->push_back(c);
}

}  // namespace mutwo::planner
