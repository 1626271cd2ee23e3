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

/// Renders the series as one SVG document.
std::string render_svg(const std::vector<Series>& series, const ChartOptions& options);
/// Writes it to `path` (throws IoError).
void write_svg(const std::string& path, const std::vector<Series>& series, const ChartOptions& options);

}  // namespace phalanx::tools
