#include "svg_chart.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>

#include <phalanx/core/error.hpp>
#include <phalanx/core/file_safety.hpp>

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

Axis nice_axis(double lo, double hi, int target, bool integral) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  if (integral && step < 1) step = 1;
  // A hair of tolerance, so that 0.30000000000000004 / 0.1 does not open one more interval.
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  return {first * step, last * step, step};
}

std::vector<double> Axis::ticks() const {
  std::vector<double> t;
  const long long first = std::llround(lo / step), last = std::llround(hi / step);
  for (long long k = first; k <= last; ++k) t.push_back(static_cast<double>(k) * step);
  return t;
}

std::string Axis::label(double v) const {
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", decimals, v == 0 ? 0.0 : v);  // no "-0"
  return b;
}

std::string render_svg(const std::vector<Series>& series, const ChartOptions& o) {
  double x0 = std::numeric_limits<double>::max(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool integral_x = true;
  for (const auto& s : series)
    for (double v : s.x) integral_x = integral_x && (!std::isfinite(v) || v == std::round(v));
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  const double pad = (y1 - y0) * 0.03;  // the extreme points stay off the frame
  const Axis ax = nice_axis(x0, x1, 6, integral_x), ay = nice_axis(y0 - pad, y1 + pad, 5, false);
  x0 = ax.lo, x1 = ax.hi, y0 = ay.lo, y1 = ay.hi;
  const int L = 70, R = 170, T = 40, B = 55;
  const double pw = o.width - L - R, ph = o.height - T - B;
  auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * pw; };
  auto Y = [&](double v) { return T + (1 - (v - y0) / (y1 - y0)) * ph; };
  std::string svg = "<svg xmlns='http://www.w3.org/2000/svg' width='" + std::to_string(o.width) + "' height='" +
                    std::to_string(o.height) + "' font-family='sans-serif' font-size='12'>\n";
  svg += "<rect width='100%' height='100%' fill='white'/>\n";
  svg += "<text x='" + std::to_string(o.width / 2) + "' y='22' text-anchor='middle' font-size='15'>" + esc(o.title) +
         "</text>\n";
  // Grid and ticks at round values (1, 2 or 5 x 10^k apart).
  for (double yv : ay.ticks()) {
    svg += "<line x1='" + fmt(L) + "' x2='" + fmt(L + pw) + "' y1='" + fmt(Y(yv)) + "' y2='" + fmt(Y(yv)) +
           "' stroke='#ddd'/>\n";
    svg += "<text class='ytick' x='" + fmt(L - 6) + "' y='" + fmt(Y(yv) + 4) + "' text-anchor='end'>" + ay.label(yv) +
           "</text>\n";
  }
  for (double xv : ax.ticks()) {
    svg += "<line x1='" + fmt(X(xv)) + "' x2='" + fmt(X(xv)) + "' y1='" + fmt(T) + "' y2='" + fmt(T + ph) +
           "' stroke='#eee'/>\n";
    svg += "<text class='xtick' x='" + fmt(X(xv)) + "' y='" + fmt(T + ph + 18) + "' text-anchor='middle'>" +
           ax.label(xv) + "</text>\n";
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
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) pts += fmt(X(s.x[i])) + "," + fmt(Y(s.y[i])) + " ";
    // Earlier series are drawn wider, so a curve lying on another one stays visible.
    const double width = std::max(1.5, 6.0 - 1.5 * static_cast<double>(k));
    svg += "<polyline fill='none' stroke='" + std::string(color) + "' stroke-width='" + fmt(width) +
           "' stroke-opacity='0.85' points='" + pts + "'/>\n";
    // A marker on every point; a later series' markers are smaller, like its line.
    const std::string marker = "' r='" + fmt(width / 2 + 1.5) + "' fill='" + color + "' stroke='white'/>\n";
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]))
        svg += "<circle cx='" + fmt(X(s.x[i])) + "' cy='" + fmt(Y(s.y[i])) + marker;
    const double ly = T + 14 + 20.0 * k;
    svg += "<line x1='" + fmt(L + pw + 12) + "' x2='" + fmt(L + pw + 36) + "' y1='" + fmt(ly - 4) + "' y2='" +
           fmt(ly - 4) + "' stroke='" + color + "' stroke-width='3'/>\n";
    svg += "<circle cx='" + fmt(L + pw + 24) + "' cy='" + fmt(ly - 4) + marker;
    svg += "<text x='" + fmt(L + pw + 42) + "' y='" + fmt(ly) + "'>" + esc(s.label) + "</text>\n";
  }
  return svg + "</svg>\n";
}

void write_svg(const std::string& path, const std::vector<Series>& series, const ChartOptions& o) {
  const std::string svg = render_svg(series, o);
  const int fd = files::open_output(path, false);  // never through a symbolic link another user planted
  std::size_t done = 0;
  while (done < svg.size()) {
    const ssize_t w = ::write(fd, svg.data() + done, svg.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) break;
    done += static_cast<std::size_t>(w);
  }
  // A full disk shows now, not as a 0-byte chart.
  if (::close(fd) != 0 || done < svg.size()) throw IoError(path + ": write failed (disk full?); the chart is incomplete");
}

}  // namespace phalanx::tools
