#include "data/collate.h"

#include <algorithm>

namespace st {

StatusOr<int32_t> ResolvePadId(const Tokenizer& tok, const CollateOptions& options) {
  if (options.pad_id >= 0) return options.pad_id;
  if (tok.pad_id() >= 0) return tok.pad_id();
  if (tok.eos_id() >= 0) return tok.eos_id();
  return InvalidArgument("the tokenizer has neither a pad nor an eos token; set a pad id");
}

void TokenizedSet::Add(std::span<const int32_t> example_ids,
                       std::span<const uint8_t> example_trained,
                       std::span<const ImageRef> example_images) {
  images.insert(images.end(), example_images.begin(), example_images.end());
  image_offsets.push_back(static_cast<int64_t>(images.size()));
  ST_CHECK(example_ids.size() == example_trained.size());
  ST_CHECK(static_cast<int64_t>(example_ids.size()) <= T) << example_ids.size() << " > " << T;
  ids.insert(ids.end(), example_ids.begin(), example_ids.end());
  trained.insert(trained.end(), example_trained.begin(), example_trained.end());
  offsets.push_back(static_cast<int64_t>(ids.size()));
  // The first token is never a target (nothing precedes it in its row or its document).
  if (std::find(example_trained.begin() + (example_trained.empty() ? 0 : 1), example_trained.end(),
                uint8_t{1}) == example_trained.end())
    ++untrained;
}

void AddExample(RenderedExample e, const CollateOptions& options, TokenizedSet* set) {
  const int64_t T = options.max_seq_len;
  ST_CHECK_GE(T, 1);
  set->T = T;
  const int64_t n = static_cast<int64_t>(e.ids.size());
  if (n <= T) {
    set->Add(e.ids, e.trained, e.images);
    return;
  }
  if (!options.split_long) {
    ++set->truncated;
    const size_t images = e.images.size();
    e.Truncate(static_cast<size_t>(T));
    set->images_dropped += static_cast<int64_t>(images - e.images.size());
    set->Add(e.ids, e.trained, e.images);
    return;
  }
  ++set->split;
  // Pieces of at most T tokens; a piece that would cut an image's block ends before it, so the
  // image starts the next piece (an image longer than T is dropped with the text around it).
  size_t image = 0;
  auto piece = [&](int64_t b, int64_t end, size_t first_image, size_t images) {
    if (end <= b) return;
    set->Add(std::span<const int32_t>(e.ids).subspan(static_cast<size_t>(b),
                                                     static_cast<size_t>(end - b)),
             std::span<const uint8_t>(e.trained).subspan(static_cast<size_t>(b),
                                                         static_cast<size_t>(end - b)),
             std::span<const ImageRef>(e.images).subspan(first_image, images - first_image));
  };
  for (int64_t b = 0; b < n;) {
    int64_t end = std::min(T + b, n);
    const size_t first_image = image;
    bool too_long = false;  // an image block longer than a piece, starting this one
    while (image < e.image_spans.size() && static_cast<int64_t>(e.image_spans[image].first) < end) {
      const int64_t lo = static_cast<int64_t>(e.image_spans[image].first);
      if (static_cast<int64_t>(e.image_spans[image].second) > end) {  // cut inside the block
        if (lo > b)
          end = lo;
        else
          too_long = true;
        break;
      }
      ++image;
    }
    if (too_long) {  // dropped with its tokens
      ++set->images_dropped;
      b = static_cast<int64_t>(e.image_spans[image++].second);
      continue;
    }
    piece(b, end, first_image, image);
    b = end;
  }
}

StatusOr<TokenizedSet> TokenizeDataset(const InstructionDataset& ds,
                                       const ExampleRenderer& renderer,
                                       const CollateOptions& options, DatasetReport* report) {
  if (options.max_seq_len < 1)
    return InvalidArgument(StrCat("max_seq_len must be >= 1, got ", options.max_seq_len));
  TokenizedSet set;
  set.T = options.max_seq_len;
  RenderedExample e;
  ST_RETURN_IF_ERROR(ds.ForEach(
      [&](const InstructionRecord& r) {
        ST_RETURN_IF_ERROR(renderer.Render(r, &e).WithContext(
            StrCat("--template ", TemplateKindName(renderer.kind()), ": record at ",
                   ds.position_unit(), " ", r.line)));
        AddExample(e, options, &set);
        return Status::Ok();
      },
      report));
  return set;
}

TokenBatch Collate(const TokenizedSet& set, std::span<const int64_t> rows, int32_t pad_id,
                   bool pad_left, int64_t T) {
  TokenBatch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = T > 0 ? T : set.T;
  b.input_ids.assign(b.B * b.T, pad_id);
  b.attention_mask.assign(b.B * b.T, 0);
  b.labels.assign(b.B * b.T, kIgnoreIndex);
  for (int64_t i = 0; i < b.B; ++i) {
    ST_CHECK(rows[i] >= 0 && rows[i] < set.size()) << "row " << rows[i] << " of " << set.size();
    const int64_t n = set.length(rows[i]), src = set.offsets[rows[i]];
    ST_CHECK(n <= b.T) << "example of " << n << " tokens in a row of " << b.T;
    const int64_t dst = i * b.T + (pad_left ? b.T - n : 0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = set.ids[src + t];
      b.input_ids[dst + t] = id;
      b.attention_mask[dst + t] = 1;
      b.labels[dst + t] = set.trained[src + t] ? id : kIgnoreIndex;
    }
    b.real_tokens += n;
    if (set.has_images())  // (only Add adds images, and it keeps image_offsets per example)
      for (int64_t k = set.image_offsets[rows[i]]; k < set.image_offsets[rows[i] + 1]; ++k)
        b.images.push_back(&set.images[static_cast<size_t>(k)]);
  }
  return b;
}

}  // namespace st
