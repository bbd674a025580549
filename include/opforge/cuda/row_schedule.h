// How the CachedRow kernels of the norms and softmax (opforge/cuda/rows.cuh) take their rows: a
// block per row (the default: 98-100% of the H100's copy bandwidth, 1-3% behind torch.compile's
// kernels) or resident: as many blocks as the GPU holds at once, each walking its rows with the
// next row's loads issued before it works on the current one. Process-wide; a switch for the
// benchmark (opforge._core.set_resident_rows) until a GPU run says which is faster.
#pragma once

namespace opforge::cuda {

bool resident_rows();
bool set_resident_rows(bool on);  // returns the previous setting

}  // namespace opforge::cuda
