// Dimension letters used in every shape comment of slicetrain (stated once, used everywhere):
//   B batch, T sequence, N = B*T tokens, d hidden, H query heads, Hkv kv heads, D head dim
//   (per layer: head_dim for sliding layers, global_head_dim for full layers), F MLP width,
//   V vocab, L layers, P per-layer-input (PLE) width.
// "axis" means a device-mesh axis; "dim" means a tensor dimension.
#pragma once
