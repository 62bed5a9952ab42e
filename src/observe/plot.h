// The end-of-run plot: loss and throughput against the global step, as a standalone SVG written
// by hand (no plotting library), and a PNG beside it when rsvg-convert or ImageMagick's convert is
// on PATH. Not a general plotting API: two fixed panels.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace st::observe {

struct Series {
  std::string name;
  std::string color;                              // CSS colour
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
};

struct Panel {
  std::string title, y_label;
  std::vector<Series> series;
};

// A well-formed SVG document of the panels stacked vertically, sharing the x axis label.
std::string PlotSvg(const std::string& title, const std::string& x_label,
                    const std::vector<Panel>& panels);

// Reads <run_dir>/metrics.jsonl and writes <run_dir>/training_curves.svg (loss per step and the
// epochs' mean loss; padded and real tokens/s), then training_curves.png if a converter exists.
// Returns the paths written (svg first).
StatusOr<std::vector<std::string>> WriteTrainingCurves(const std::string& run_dir,
                                                       const std::string& run_name);

// The path of `program` found on $PATH, or "".
std::string FindOnPath(const std::string& program);

}  // namespace st::observe
