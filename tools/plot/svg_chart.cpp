#include "svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include <phalanx/core/error.hpp>

namespace phalanx::tools {

namespace {
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}
}  // namespace

std::string render_svg(const std::vector<Series>& series, const ChartOptions& o) {
  double x0 = std::numeric_limits<double>::max(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  const int L = 70, R = 170, T = 40, B = 55;
  const double pw = o.width - L - R, ph = o.height - T - B;
  auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * pw; };
  auto Y = [&](double v) { return T + (1 - (v - y0) / (y1 - y0)) * ph; };
  std::string svg = "<svg xmlns='http://www.w3.org/2000/svg' width='" + std::to_string(o.width) + "' height='" +
                    std::to_string(o.height) + "' font-family='sans-serif' font-size='12'>\n";
  svg += "<rect width='100%' height='100%' fill='white'/>\n";
  svg += "<text x='" + std::to_string(o.width / 2) + "' y='22' text-anchor='middle' font-size='15'>" + esc(o.title) +
         "</text>\n";
  for (int i = 0; i <= 5; ++i) {  // grid and ticks
    const double yv = y0 + (y1 - y0) * i / 5;
    double xv = x0 + (x1 - x0) * i / 5;
    if (x1 - x0 >= 10) xv = std::round(xv);  // whole epochs
    svg += "<line x1='" + fmt(L) + "' x2='" + fmt(L + pw) + "' y1='" + fmt(Y(yv)) + "' y2='" + fmt(Y(yv)) +
           "' stroke='#ddd'/>\n";
    svg += "<text x='" + fmt(L - 6) + "' y='" + fmt(Y(yv) + 4) + "' text-anchor='end'>" + fmt(yv) + "</text>\n";
    svg += "<text x='" + fmt(X(xv)) + "' y='" + fmt(T + ph + 18) + "' text-anchor='middle'>" + fmt(xv) + "</text>\n";
  }
  svg += "<rect x='" + fmt(L) + "' y='" + fmt(T) + "' width='" + fmt(pw) + "' height='" + fmt(ph) +
         "' fill='none' stroke='#333'/>\n";
  svg += "<text x='" + fmt(L + pw / 2) + "' y='" + fmt(o.height - 12) + "' text-anchor='middle'>" + esc(o.x_label) +
         "</text>\n";
  svg += "<text transform='translate(18," + fmt(T + ph / 2) + ") rotate(-90)' text-anchor='middle'>" +
         esc(o.y_label) + "</text>\n";
  for (std::size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof *kColors)];
    std::string pts;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i])) pts += fmt(X(s.x[i])) + "," + fmt(Y(s.y[i])) + " ";
    // Earlier series are drawn wider, so a curve lying on another one stays visible.
    const double width = std::max(1.5, 6.0 - 1.5 * static_cast<double>(k));
    svg += "<polyline fill='none' stroke='" + std::string(color) + "' stroke-width='" + fmt(width) +
           "' stroke-opacity='0.85' points='" + pts + "'/>\n";
    const double ly = T + 14 + 20.0 * k;
    svg += "<line x1='" + fmt(L + pw + 12) + "' x2='" + fmt(L + pw + 36) + "' y1='" + fmt(ly - 4) + "' y2='" +
           fmt(ly - 4) + "' stroke='" + color + "' stroke-width='3'/>\n";
    svg += "<text x='" + fmt(L + pw + 42) + "' y='" + fmt(ly) + "'>" + esc(s.label) + "</text>\n";
  }
  return svg + "</svg>\n";
}

void write_svg(const std::string& path, const std::vector<Series>& series, const ChartOptions& o) {
  std::ofstream f(path);
  if (!f) throw IoError(path + ": cannot write the chart");
  f << render_svg(series, o);
}

}  // namespace phalanx::tools
