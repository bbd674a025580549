// Dims (opforge/dims.h): a vector of sizes or strides that stays inline up to kInline values
// and moves to the heap past them. Each operation is checked against std::vector doing the
// same, on both sides of that boundary.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "opforge/dims.h"
#include "opforge/error.h"

namespace opforge {
namespace {

using Ints = std::vector<int64_t>;

Ints ints(const Dims& d) { return {d.begin(), d.end()}; }

TEST(Dims, BuiltLikeAVector) {
  EXPECT_TRUE(Dims().empty());
  EXPECT_EQ(ints(Dims{2, 3, 4}), (Ints{2, 3, 4}));
  EXPECT_EQ(ints(Dims(3, 7)), (Ints{7, 7, 7}));
  EXPECT_EQ(ints(Dims(size_t{2})), (Ints{0, 0}));
  const Ints long_one{1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(ints(Dims(long_one)), long_one);
  EXPECT_EQ(ints(Dims(long_one.begin() + 2, long_one.end() - 1)), (Ints{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(Dims(long_one).vec(), long_one);
  EXPECT_EQ(Dims({1, 2}), (Ints{1, 2}));  // compared with a vector, converted
  EXPECT_NE(Dims({1, 2}), (Dims{1, 2, 3}));
  EXPECT_LT(Dims({1, 2}), (Dims{1, 3}));
}

TEST(Dims, StaysInlineUpToKInlineThenMovesToTheHeap) {
  Dims d;
  const int64_t* inline_data = d.data();
  for (int64_t i = 0; i < static_cast<int64_t>(Dims::kInline); ++i) d.push_back(i);
  EXPECT_EQ(d.data(), inline_data);
  d.push_back(99);
  EXPECT_NE(d.data(), inline_data);
  EXPECT_EQ(ints(d), (Ints{0, 1, 2, 3, 4, 5, 99}));
  EXPECT_GE(d.capacity(), d.size());
}

// Random operations on a Dims and a std::vector side by side, crossing the inline boundary
// both ways, through copies and moves of either kind.
TEST(Dims, EveryOperationAsAVectorDoesIt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Dims d;
    Ints v;
    for (int step = 0; step < 40; ++step) {
      const int64_t x = static_cast<int64_t>(rng() % 100) - 50;
      const size_t at = v.empty() ? 0 : rng() % (v.size() + 1);
      switch (rng() % 10) {
        case 0: case 1: case 2: d.push_back(x); v.push_back(x); break;
        case 3: if (!v.empty()) { d.pop_back(); v.pop_back(); } break;
        case 4: d.insert(d.begin() + at, x); v.insert(v.begin() + static_cast<ptrdiff_t>(at), x); break;
        case 5: {
          const Ints more{x, x + 1, x + 2};
          d.insert(d.begin() + at, more.begin(), more.end());
          v.insert(v.begin() + static_cast<ptrdiff_t>(at), more.begin(), more.end());
          break;
        }
        case 6: if (at < v.size()) { d.erase(d.begin() + at); v.erase(v.begin() + static_cast<ptrdiff_t>(at)); } break;
        case 7: { const size_t n = rng() % 10; d.resize(n, x); v.resize(n, x); break; }
        case 8: { Dims copy = d; d = std::move(copy); break; }
        case 9: { Dims moved(std::move(d)); d = moved; EXPECT_EQ(ints(moved), v); break; }
      }
      ASSERT_EQ(ints(d), v) << "trial " << trial << " step " << step;
      ASSERT_EQ(d.empty(), v.empty());
      if (!v.empty()) ASSERT_EQ(d.back(), v.back());
    }
  }
}

TEST(Dims, InsertingItsOwnValues) {
  Dims d{1, 2, 3, 4, 5};
  d.insert(d.begin() + 1, d.begin(), d.end());  // grows past kInline while reading itself
  EXPECT_EQ(ints(d), (Ints{1, 1, 2, 3, 4, 5, 2, 3, 4, 5}));
}

TEST(Dims, MovedFromIsEmptyAndUsable) {
  Dims heap{1, 2, 3, 4, 5, 6, 7, 8};
  Dims taken(std::move(heap));
  EXPECT_EQ(ints(taken), (Ints{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(heap.empty());  // NOLINT(bugprone-use-after-move): defined as empty
  heap.push_back(4);
  EXPECT_EQ(ints(heap), (Ints{4}));
}

// Shape rules written when shapes were std::vectors (a plugin's) compile and run unchanged.
TEST(Dims, ConvertsToAndFromAVector) {
  const Dims d{4, 5, 6};
  const Ints copied = d;
  Ints assigned;
  assigned = d;
  EXPECT_EQ(copied, (Ints{4, 5, 6}));
  EXPECT_EQ(assigned, copied);
  EXPECT_TRUE(d == copied && copied == d);
  const Dims back = copied;
  EXPECT_EQ(back, d);
}

TEST(Dims, PrintsAsAShapeInMessages) {
  EXPECT_EQ(str("got ", Dims{2, 3}, " and ", Dims{}), "got [2, 3] and []");
}

}  // namespace
}  // namespace opforge
