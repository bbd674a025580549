// The cases of op_cases.h.
#include "op_cases.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

namespace opforge::emulated {
namespace {

using Shape = Dims;

const std::vector<Shape> kElementwise = {{0}, {1}, {7}, {3, 33}, {2, 3, 129}, {4100}};
const std::vector<std::pair<Shape, Shape>> kBroadcast = {
    {{5}, {5}}, {{3, 1}, {1, 4}}, {{2, 3, 33}, {33}}, {{4097}, {4097}}, {{0, 3}, {3}}, {{6, 1, 5}, {4, 1}},
    {{700, 3}, {3}}, {{3, 700}, {3, 1}},  // long sums along and across the inner dimension
    {{9, 64}, {64}}, {{64}, {5, 64}}, {{7, 3}, {1}}};  // a row or one value repeated: map_contiguous's periods
const std::vector<Shape> kRows = {{0, 8}, {1, 1}, {3, 33}, {5, 256}, {2, 3, 64}, {2, 4096}, {3, 8200}, {70, 40}};
// Rows side by side (x.T's layout; the row ops' panel kernels): panels cut short (9 rows: 8 and 1
// in float32; 17 in runs of a batch), chunks past 256 columns, 2 rows, 2 columns.
const std::vector<Shape> kSideBySide = {{9, 5}, {8, 600}, {2, 17, 33}, {33, 2}, {2, 40}, {40, 300}};

// A tensor of `shape` laid out as x.T: its last two dimensions swapped in memory.
HostTensor side_by_side(DType d, Shape shape, std::mt19937& rng) {
  const size_t a = shape.size() - 2, b = shape.size() - 1;
  std::swap(shape[a], shape[b]);
  HostTensor t = make(d, shape, Layout::contiguous, rng);
  std::swap(t.shape[a], t.shape[b]);
  std::swap(t.strides[a], t.strides[b]);
  return t;
}
// The case's rows: kRows in every layout, then kSideBySide (contiguous only: the layout is theirs).
int row_shapes() { return int(kRows.size() + kSideBySide.size()); }
std::optional<HostTensor> rows_input(DType d, int s, Layout l, std::mt19937& rng) {
  if (s < int(kRows.size())) return make(d, kRows[s], l, rng);
  if (l != Layout::contiguous) return std::nullopt;
  return side_by_side(d, kSideBySide[s - kRows.size()], rng);
}

Shape broadcast(Shape a, Shape b) {
  if (a.size() < b.size()) std::swap(a, b);
  for (size_t i = 0; i < b.size(); ++i) {
    int64_t& d = a[a.size() - b.size() + i];
    d = d == 1 ? b[i] : d;
  }
  return a;
}

Case unary(std::vector<AttrValue> attrs = {}) {
  return {int(kElementwise.size()), [attrs](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kElementwise[s], l, rng)}, attrs};
          }};
}
// grad and one saved tensor of the same shape (relu_backward, silu_backward, ...).
Case unary_backward(int tensors, std::vector<AttrValue> attrs = {}) {
  return {int(kElementwise.size()), [tensors, attrs](DType d, int s, Layout l, std::mt19937& rng) {
            Inputs in{{}, attrs};
            for (int i = 0; i < tensors; ++i) in.tensors.push_back(make(d, kElementwise[s], l, rng));
            return in;
          }};
}
Case binary() {
  return {int(kBroadcast.size()), [](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kBroadcast[s].first, l, rng), make(d, kBroadcast[s].second, l, rng)}, {}};
          }};
}
Case binary_backward() {
  return {int(kBroadcast.size()) * 3, [](DType d, int s, Layout l, std::mt19937& rng) {
            const auto& [x, y] = kBroadcast[s / 3];
            const int64_t mask = std::vector<int64_t>{-1, 1, 2}[s % 3];
            return Inputs{{make(d, broadcast(x, y), l, rng), make(d, x, l, rng), make(d, y, l, rng)}, {mask}};
          }};
}

Shape last(const Shape& s) { return {s.back()}; }

// The backward ops also get one tall shape, contiguous (the fused kernels) and strided (the three
// launches): more rows than the fused kernels' chunks (row_chunks: 2048 at most), so chunks hold
// several rows in every dtype, and the column sums combine hundreds of chunks (eight loads ahead,
// then the rest).
const Shape kTallRows = {2500, 512};

Case norm(bool layer, bool backward) {
  const int variants = backward ? 3 : layer ? 2 : 1;  // output masks, or with and without a bias
  const int shapes = row_shapes() * variants + (backward ? 1 : 0);
  return {shapes, [=](DType d, int s, Layout l, std::mt19937& rng) -> std::optional<Inputs> {
            const bool tall = s == row_shapes() * variants;
            if (tall && l == Layout::misaligned) return std::nullopt;  // contiguous (fused) and strided (three launches)
            const int v = tall ? 0 : s % variants;
            const std::optional<HostTensor> x = tall ? make(d, kTallRows, l, rng) : rows_input(d, s / variants, l, rng);
            if (!x) return std::nullopt;
            const Shape& shape = x->shape;
            auto positive = [](std::mt19937& r) { return 0.5 + std::uniform_real_distribution<double>(0, 1)(r); };
            Inputs in;
            if (backward) in.tensors.push_back(make(d, shape, l, rng));
            in.tensors.push_back(x);
            in.tensors.push_back(make(d, last(shape), l, rng, positive));
            if (layer && !backward) in.tensors.push_back(v ? std::optional(make(d, last(shape), l, rng)) : std::nullopt);
            in.attrs.push_back(layer ? 1e-5 : 1e-6);
            if (backward) in.attrs.push_back(std::vector<int64_t>{-1, 1, layer ? 6 : 2}[v]);
            return in;
          }};
}

Case softmax(bool backward) {
  return {row_shapes(), [=](DType d, int s, Layout l, std::mt19937& rng) -> std::optional<Inputs> {
            std::optional<HostTensor> x = rows_input(d, s, l, rng);
            if (!x) return std::nullopt;
            Inputs in{{x}, {}};
            if (backward) in.tensors.push_back(make(d, x->shape, l, rng));
            return in;
          }};
}

const char* const kActs[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
struct Product {
  Shape x;
  int64_t n;
};
const std::vector<Product> kProducts = {{{0, 4}, 3}, {{1, 1}, 1},      {{5, 3}, 7},     {{33, 65}, 17},
                                        {{2, 3, 40}, 9}, {{70, 130}, 66}, {{600, 8}, 5}};  // the last: grad_bias a long sum

Case linear(bool backward) {
  const int variants = 5 * 2;  // act x (bias or none)
  return {int(kProducts.size()) * variants, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Product& p = kProducts[s / variants];
            const char* act = kActs[s % variants / 2];
            const bool bias = s % 2 == 0;
            const int64_t k = p.x.back();
            const double scale = 1 / std::sqrt(double(std::max<int64_t>(k, 1)));
            auto scaled = [scale](std::mt19937& r) { return normal(r) * scale; };
            Shape out = p.x;
            out.back() = p.n;
            Inputs in;
            if (backward) in.tensors.push_back(make(d, out, l, rng));
            in.tensors.push_back(make(d, p.x, l, rng));
            in.tensors.push_back(make(d, {p.n, k}, l, rng, scaled));
            in.tensors.push_back(bias ? std::optional(make(d, {p.n}, l, rng)) : std::nullopt);
            if (backward)  // the saved pre-activation, or none (recomputed)
              in.tensors.push_back(s % 4 < 2 ? std::optional(make(d, out, l, rng)) : std::nullopt);
            in.attrs.push_back(std::string(act));
            if (backward) in.attrs.push_back(std::vector<int64_t>{-1, 1, 2, 4, 3}[s % 5]);
            return in;
          }};
}

Case rope(bool backward) {
  const std::vector<Shape> shapes = {{1, 1, 1, 2}, {2, 5, 3, 8}, {1, 7, 2, 66}, {3, 4, 1, 128}, {0, 4, 2, 8}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Shape& x = shapes[s / 2];
            const Shape table = {x[x.size() - 3], x.back() / 2};
            auto angle_cos = [](std::mt19937& r) { return std::cos(std::uniform_real_distribution<double>(0, 6.3)(r)); };
            return Inputs{{make(d, x, l, rng), make(d, table, l, rng, angle_cos), make(d, table, l, rng, angle_cos)},
                          {bool(s % 2)}};
          }};
  (void)backward;
}

Case scatter(bool backward) {
  struct S {
    Shape src;
    int64_t dim, dim_size;
  };
  // {200, 5} into 3: buckets of ~66 rows, two full groups of sum_kernel's 32 loads ahead and a partial one.
  // {1100, 300} into 2: buckets of ~550 rows staged in two chunks by blocks whose 256 outputs share
  // one (the first and the last, partial, block), and a block across both buckets between them.
  const std::vector<S> shapes = {{{0, 3}, 0, 4}, {{9, 5}, 0, 16}, {{40, 33}, 0, 3}, {{3, 50, 2}, 1, 7}, {{7}, 0, 1},
                                 {{200, 5}, 0, 3}, {{1100, 300}, 0, 2}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const S& c = shapes[s / 2];
            const DType index_dtype = s % 2 ? DType::int32 : DType::int64;
            const int64_t n = c.src[c.dim];
            auto bucket = [&c](std::mt19937& r) { return double(r() % c.dim_size); };
            HostTensor index = make(index_dtype, {n}, l == Layout::strided ? l : Layout::contiguous, rng, bucket);
            if (!backward) return Inputs{{make(d, c.src, l, rng), index}, {c.dim_size, c.dim}};
            Shape grad = c.src;
            grad[c.dim] = c.dim_size;
            return Inputs{{make(d, grad, l, rng), index}, {c.dim}};
          }};
}

// Values of x spread over orders of magnitude per 32-block, as quantize_q8_0's sample does.
double spread(std::mt19937& rng) { return normal(rng) * std::pow(10.0, std::uniform_int_distribution<int>(-3, 3)(rng)); }

const std::vector<Shape> kQuantRows = {{0, 32}, {1, 32}, {3, 64}, {5, 160}, {2, 3, 96}};

// Small integers: blocks whose largest magnitude several values share, with either sign (Q4_0's
// scale is the first one's, wherever in the block and whichever lane holds it).
double ties(std::mt19937& rng) { return double(int(rng() % 7) - 3); }

Case quantize() {
  return {int(kQuantRows.size()) * 2, [](DType d, int s, Layout l, std::mt19937& rng) {
            return Inputs{{make(d, kQuantRows[s / 2], l, rng, s % 2 ? ties : spread)}, {}};
          }};
}

// Quantized bytes of random rows, by the CPU quantizer: packed, one byte in (misaligned), or with
// rows three bytes apart (strided).
HostTensor quantized(const std::string& format, Shape rows, std::mt19937& rng, Layout layout = Layout::contiguous) {
  const HostTensor x = make(DType::float32, rows, Layout::contiguous, rng);
  const Outcome q = run_on("cpu", "quantize_" + format, {{x}, {}});
  EXPECT_EQ(q.error, "");
  const Shape shape = q.specs[0].shape;
  HostTensor t{DType::uint8, shape, contiguous_strides(shape)};
  const int64_t row = shape.back(), count = int64_t(q.results[0].size()) / std::max<int64_t>(row, 1);
  const int64_t pitch = layout == Layout::strided ? row + 3 : row;
  t.offset = layout == Layout::misaligned ? 1 : 0;
  if (layout == Layout::strided)
    for (size_t d = 0; d + 1 < shape.size(); ++d) t.strides[d] = t.strides[d] / row * pitch;
  t.bytes.assign(size_t(t.offset + count * pitch + 1), 0xee);
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(t.bytes.data() + t.offset + r * pitch, q.results[0].data() + r * row, size_t(row));
  return t;
}

Case dequantize() {
  return {int(kQuantRows.size()) * 2, [](DType, int s, Layout l, std::mt19937& rng) {
            const std::string format = s % 2 ? "q4_0" : "q8_0";
            return Inputs{{quantized(format, kQuantRows[s / 2], rng, l)}, {format}};
          }};
}

Case matmul_q() {
  // m <= 8 takes the warp-per-column kernel (35 blocks: a second, partial chunk of 32; with rows of
  // a multiple of 8 blocks, contiguous weights load as 16-byte pieces: 72 and 8 blocks; one row of
  // up to 256 blocks quantized inside it (40 columns: warps with a second one when the grid is cut
  // to 3 blocks), 257 blocks by the quantizer first), m = 9 to 63 the lane-per-row tiles of 32
  // rows x 16 columns (37 x 19 blocks x 21: a second, partial tile each
  // way and a second, partial chunk of 16 blocks; 40 blocks in pieces), m >= 64 the tensor-core
  // tiles of 64 rows x 32 columns (70 x 10 blocks x 37: a second, partial tile each way and a
  // partial chunk of 8 blocks; 16 blocks in pieces)
  const std::vector<Product> shapes = {{{0, 32}, 3}, {{1, 32}, 1},   {{5, 64}, 7},    {{9, 96}, 33},
                                       {{2, 3, 64}, 5}, {{3, 1120}, 9}, {{8, 64}, 4}, {{37, 608}, 21},
                                       {{70, 320}, 37}, {{3, 2304}, 9}, {{1, 256}, 40},
                                       {{37, 1280}, 21}, {{70, 512}, 37}, {{1, 8224}, 3}};
  return {int(shapes.size()) * 2, [=](DType d, int s, Layout l, std::mt19937& rng) {
            const Product& p = shapes[s / 2];
            const std::string format = s % 2 ? "q4_0" : "q8_0";
            return Inputs{{make(d, p.x, l, rng), quantized(format, {p.n, p.x.back()}, rng)}, {format}};
          }};
}

}  // namespace

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> table = {
      {"add", binary()},
      {"mul", binary()},
      {"add_one", unary()},
      {"relu", unary()},
      {"silu", unary()},
      {"gelu", {int(kElementwise.size()) * 2, [](DType d, int s, Layout l, std::mt19937& rng) {
                  return Inputs{{make(d, kElementwise[s / 2], l, rng)}, {std::string(s % 2 ? "tanh" : "none")}};
                }}},
      {"add_one_backward", unary_backward(1)},
      {"relu_backward", unary_backward(2)},
      {"silu_backward", unary_backward(2)},
      {"gelu_backward", {int(kElementwise.size()) * 2, [](DType d, int s, Layout l, std::mt19937& rng) {
                           return Inputs{{make(d, kElementwise[s / 2], l, rng), make(d, kElementwise[s / 2], l, rng)},
                                         {std::string(s % 2 ? "tanh" : "none")}};
                         }}},
      {"add_backward", binary_backward()},
      {"mul_backward", binary_backward()},
      {"rms_norm", norm(false, false)},
      {"layer_norm", norm(true, false)},
      {"rms_norm_backward", norm(false, true)},
      {"layer_norm_backward", norm(true, true)},
      {"softmax", softmax(false)},
      {"softmax_backward", softmax(true)},
      {"linear_act", linear(false)},
      {"linear_act_with_preact", linear(false)},
      {"linear_act_backward", linear(true)},
      {"rope", rope(false)},
      {"rope_backward", rope(true)},
      {"scatter_add", scatter(false)},
      {"scatter_add_backward", scatter(true)},
      {"quantize_q8_0", quantize()},
      {"quantize_q4_0", quantize()},
      {"dequantize", dequantize()},
      {"matmul_q", matmul_q()},
  };
  return table;
}


}  // namespace opforge::emulated
