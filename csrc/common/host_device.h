// Marks the per-element functions that both the CPU and the CUDA kernels call, so the math
// exists once (the model is torchvision's box_iou_rotated_utils.h). Headers using it must not
// include torch: they are compiled by nvcc for device code too.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TF_HOST_DEVICE __host__ __device__
#define TF_INLINE __forceinline__
#else
#define TF_HOST_DEVICE
#define TF_INLINE inline
#endif
