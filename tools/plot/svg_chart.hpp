#pragma once
// A small SVG line chart (loss curves), no dependencies.
#include <string>
#include <vector>

namespace phalanx::tools {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct ChartOptions {
  std::string title;
  std::string x_label = "epoch";
  std::string y_label = "loss";
  int width = 720, height = 420;
};

/// An axis from lo to hi with ticks `step` apart, step being 1, 2 or 5 x 10^k.
struct Axis {
  double lo, hi, step;
  std::vector<double> ticks() const;
  std::string label(double v) const;  ///< as many decimals as the step needs
};
/// The round axis around [lo, hi] with about `target` intervals (steps >= 1 when integral).
Axis nice_axis(double lo, double hi, int target, bool integral);

/// Renders the series as one SVG document: round ticks, a line and a marker per point.
std::string render_svg(const std::vector<Series>& series, const ChartOptions& options);
/// Writes it to `path` (throws IoError).
void write_svg(const std::string& path, const std::vector<Series>& series, const ChartOptions& options);

}  // namespace phalanx::tools
