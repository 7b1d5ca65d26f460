// CandidateIndex: the policy's index of candidates over the positions they
// are inactive at, so a round finds the best candidate inactive at the peak
// in O(log^2 positions) instead of a scan. Header-only: Best() takes the
// policy's validity and key functions as templates. Not thread-safe.
#ifndef MUTWO_PLANNER_CANDIDATE_INDEX_H_
#define MUTWO_PLANNER_CANDIDATE_INDEX_H_

#include <algorithm>
#include <vector>

namespace mutwo::planner {

// Entries (key, id) on position intervals. Best(position) is the valid entry
// with the largest current key, ties to the smallest id, among those whose
// interval contains the position: the candidate that the full scan in index
// order with a strict ">" picks. A segment tree over the positions; an
// interval sits in O(log positions) nodes. Each node holds the entries given
// to Build() (one per id) as an array of ids sorted best first with a
// cursor, and the ones added later in a heap. Entries are not removed eagerly:
// an invalid one (which must stay invalid) is dropped when it reaches the
// front; one whose key is no longer the current key is re-queued in that node
// under the current key. This is exact while a key only decreases after it was
// indexed (stored >= current: the front, when current, is the node's best);
// a key that increases must be Add()ed again.
class CandidateIndex {
 public:
  explicit CandidateIndex(int positions) {
    while (size_ < positions) size_ *= 2;
  }

  struct Item {
    int lo, hi;  // positions, inclusive
    double key;
    int id;
  };

  // The initial entries, at most one per id (reorders `items`).
  void Build(std::vector<Item>& items) {
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return Less(Entry{b.key, b.id}, Entry{a.key, a.id});
    });
    int max_id = -1;
    for (const Item& item : items) max_id = std::max(max_id, item.id);
    built_key_.assign(max_id + 1, 0);
    for (const Item& item : items) built_key_[item.id] = item.key;
    offsets_.assign(2 * size_ + 1, 0);
    for (const Item& item : items) {
      ForEachNode(item.lo, item.hi, [&](int node) { ++offsets_[node + 1]; });
    }
    for (int node = 0; node < 2 * size_; ++node) {
      offsets_[node + 1] += offsets_[node];
    }
    ids_.resize(offsets_.back());
    // Filled best first, so each node's array is sorted.
    cursor_.assign(offsets_.begin(), offsets_.end() - 1);
    for (const Item& item : items) {
      ForEachNode(item.lo, item.hi,
                  [&](int node) { ids_[cursor_[node]++] = item.id; });
    }
    cursor_.assign(offsets_.begin(), offsets_.end() - 1);
    heap_of_.assign(2 * static_cast<size_t>(size_), -1);
    heaps_.clear();
  }

  // After Build().
  void Add(int lo, int hi, double key, int id) {
    ForEachNode(lo, hi, [&](int node) { Push(node, Entry{key, id}); });
  }

  // valid(id): the candidate may still be chosen; key(id): its current key.
  template <typename Valid, typename Key>
  int Best(int position, const Valid& valid, const Key& key) {
    int best = -1;
    double best_key = 0;
    auto consider = [&](const Entry& e) {
      if (best < 0 || e.key > best_key || (e.key == best_key && e.id < best)) {
        best = e.id;
        best_key = e.key;
      }
    };
    for (int node = position + size_; node >= 1; node >>= 1) {
      for (int& i = cursor_[node]; i < offsets_[node + 1]; ++i) {
        const Entry e{built_key_[ids_[i]], ids_[i]};
        if (!valid(e.id)) continue;
        const double current = key(e.id);
        if (current == e.key) {
          consider(e);
          break;
        }
        Push(node, Entry{current, e.id});
      }
      if (heap_of_[node] < 0) continue;
      std::vector<Entry>& heap = heaps_[heap_of_[node]];
      while (!heap.empty()) {
        const Entry e = heap.front();
        if (valid(e.id) && key(e.id) == e.key) {
          consider(e);
          break;
        }
        std::pop_heap(heap.begin(), heap.end(), Less);
        heap.pop_back();
        if (valid(e.id)) Push(node, Entry{key(e.id), e.id});
      }
    }
    return best;
  }

 private:
  struct Entry {
    double key;
    int id;
  };
  static bool Less(const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.id > b.id;
  }
  template <typename F>
  void ForEachNode(int lo, int hi, const F& f) {
    for (int l = lo + size_, r = hi + size_ + 1; l < r; l >>= 1, r >>= 1) {
      if (l & 1) f(l++);
      if (r & 1) f(--r);
    }
  }
  void Push(int node, const Entry& e) {
    if (heap_of_[node] < 0) {
      heap_of_[node] = static_cast<int>(heaps_.size());
      heaps_.emplace_back();
    }
    std::vector<Entry>& heap = heaps_[heap_of_[node]];
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), Less);
  }

  int size_ = 1;
  std::vector<int> offsets_, cursor_;
  std::vector<int> ids_;
  std::vector<double> built_key_;  // by id
  std::vector<int> heap_of_;
  std::vector<std::vector<Entry>> heaps_;
};

}  // namespace mutwo::planner

#endif  // MUTWO_PLANNER_CANDIDATE_INDEX_H_
