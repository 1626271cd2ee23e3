// std::cout << t: the values, formatted as PyTorch 1.13's repr (torch/_tensor_str.py, default
// print options: precision 4, threshold 1000, edgeitems 3, linewidth 80).
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "phalanx/core/autograd.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

namespace {

constexpr int kPrecision = 4;
constexpr std::int64_t kThreshold = 1000, kEdge = 3, kLineWidth = 80;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string special(double v) {  // Python's spelling of the non-finite values
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

struct Formatter {
  bool floating = true, int_mode = true, sci_mode = false, boolean = false;
  std::size_t width = 1;

  Formatter(const std::vector<double>& vals, bool is_float, bool is_bool = false)
      : floating(is_float && !is_bool), boolean(is_bool) {
    if (boolean) {  // "True" / "False", right-aligned to the widest shown
      width = 4;
      for (double v : vals)
        if (v == 0) width = 5;
      return;
    }
    if (!floating) {
      for (double v : vals) width = std::max(width, std::to_string(static_cast<long long>(v)).size());
      return;
    }
    std::vector<double> nz;
    for (double v : vals)
      if (std::isfinite(v) && v != 0) nz.push_back(v);
    if (nz.empty()) return;
    double mn = std::abs(nz[0]), mx = mn;
    for (double v : nz) {
      mn = std::min(mn, std::abs(v));
      mx = std::max(mx, std::abs(v));
      if (v != std::ceil(v)) int_mode = false;
    }
    const char* sci = "%.4e";
    if (int_mode) {
      sci_mode = mx / mn > 1000.0 || mx > 1.0e8;
      for (double v : nz) width = std::max(width, sci_mode ? fmt(sci, v).size() : fmt("%.0f", v).size() + 1);
    } else {
      sci_mode = mx / mn > 1000.0 || mx > 1.0e8 || mn < 1.0e-4;
      for (double v : nz) width = std::max(width, fmt(sci_mode ? sci : "%.4f", v).size());
    }
  }

  std::string format(double v) const {
    std::string r;
    if (boolean) {
      r = v != 0 ? "True" : "False";
    } else if (!floating) {
      r = std::to_string(static_cast<long long>(v));
    } else if (!std::isfinite(v)) {
      r = special(v);
    } else if (sci_mode) {
      r = fmt("%.4e", v);
    } else if (int_mode) {
      r = fmt("%.0f", v) + ".";
    } else {
      r = fmt("%.4f", v);
    }
    return r.size() < width ? std::string(width - r.size(), ' ') + r : r;
  }
};

struct Printer {
  const std::vector<double>& v;
  const Shape& shape;
  std::vector<std::int64_t> strides;
  bool summarize;

  Printer(const std::vector<double>& values, const Shape& s, bool sum) : v(values), shape(s), summarize(sum) {
    strides.assign(s.size(), 1);
    for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * s[i + 1];
  }

  /// The indices along dim `d` that are shown (all, or the edges when summarising).
  std::vector<std::int64_t> shown(std::size_t d) const {
    std::vector<std::int64_t> idx;
    const std::int64_t n = shape[d];
    if (summarize && n > 2 * kEdge) {
      for (std::int64_t i = 0; i < kEdge; ++i) idx.push_back(i);
      for (std::int64_t i = n - kEdge; i < n; ++i) idx.push_back(i);
    } else {
      for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }

  void collect(std::size_t d, std::int64_t off, std::vector<double>& out) const {  // get_summarized_data
    if (d == shape.size()) {
      out.push_back(v[static_cast<std::size_t>(off)]);
      return;
    }
    for (std::int64_t i : shown(d)) collect(d + 1, off + i * strides[d], out);
  }

  std::string str(std::size_t d, std::int64_t off, std::int64_t indent, const Formatter& f) const {
    const std::size_t dims = shape.size() - d;
    if (dims == 0) return f.format(v[static_cast<std::size_t>(off)]);
    const std::int64_t n = shape[d];
    const bool cut = summarize && n > 2 * kEdge;
    std::vector<std::string> parts;
    if (dims == 1) {  // _vector_str
      const std::int64_t per_line =
          std::max<std::int64_t>(1, (kLineWidth - indent) / static_cast<std::int64_t>(f.width + 2));
      std::vector<std::string> data;
      for (std::int64_t i : shown(d)) {
        if (cut && i == n - kEdge) data.push_back(" ...");
        data.push_back(f.format(v[static_cast<std::size_t>(off + i * strides[d])]));
      }
      std::string s = "[";
      for (std::size_t i = 0; i < data.size(); ++i) {
        if (i) s += static_cast<std::int64_t>(i) % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        s += data[i];
      }
      return s + "]";
    }
    for (std::int64_t i : shown(d)) {
      if (cut && i == n - kEdge) parts.push_back("...");
      parts.push_back(str(d + 1, off + i * strides[d], indent + 1, f));
    }
    const std::string sep = "," + std::string(dims - 1, '\n') + std::string(indent + 1, ' ');
    std::string s = "[";
    for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
    return s + "]";
  }
};

std::vector<double> host_values(const Tensor& t) {
  const Tensor c = t.is_contiguous() ? (t.device().type == DeviceType::CPU ? t : t.to(Device::cpu()))
                                     : t.clone().to(Device::cpu());
  std::vector<double> out(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (c.dtype()) {
      case DType::Float32: out[i] = c.data<float>()[i]; break;
      case DType::Int64: out[i] = static_cast<double>(c.data<std::int64_t>()[i]); break;
      case DType::Float16: out[i] = fp16_to_float(static_cast<const std::uint16_t*>(c.raw_data())[i]); break;
      case DType::BFloat16: out[i] = bf16_to_float(static_cast<const std::uint16_t*>(c.raw_data())[i]); break;
      case DType::Bool: out[i] = static_cast<const std::uint8_t*>(c.raw_data())[i] != 0; break;
    }
  }
  return out;
}

std::string tuple_str(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  const std::string prefix = "tensor(";
  const std::int64_t indent = static_cast<std::int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  if (t.device().type != DeviceType::CPU) suffixes.push_back("device='" + t.device().str() + "'");
  const DType dt = t.dtype();
  const bool is_float = dt != DType::Int64;
  const std::string dtype_suffix = std::string("dtype=torch.") + (dt == DType::Float16 ? "float16"
                                                                  : dt == DType::BFloat16 ? "bfloat16"
                                                                  : dt == DType::Int64  ? "int64"
                                                                  : dt == DType::Bool   ? "bool"
                                                                                        : "float32");
  std::string body;
  if (t.numel() == 0) {
    if (t.dim() != 1) suffixes.push_back("size=" + tuple_str(t.shape()));
    if (dt != DType::Float32) suffixes.push_back(dtype_suffix);
    body = "[]";
  } else {
    if (dt == DType::Float16 || dt == DType::BFloat16) suffixes.push_back(dtype_suffix);
    const std::vector<double> vals = host_values(t);
    const Printer p(vals, t.shape(), t.numel() > kThreshold);
    std::vector<double> shown;
    if (p.summarize)
      p.collect(0, 0, shown);
    const Formatter f(p.summarize ? shown : vals, is_float, dt == DType::Bool);
    body = p.str(0, 0, indent, f);
  }
  if (t.grad_fn())
    suffixes.push_back(std::string("grad_fn=<") + t.grad_fn()->name() + ">");
  else if (t.requires_grad())
    suffixes.push_back("requires_grad=True");
  std::string out = prefix + body;
  const std::size_t nl = out.rfind('\n');
  std::int64_t last = static_cast<std::int64_t>(out.size()) -
                      (nl == std::string::npos ? -1 : static_cast<std::int64_t>(nl)) + 1;
  for (const std::string& s : suffixes) {
    const auto len = static_cast<std::int64_t>(s.size());
    if (last + len + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + s;
      last = indent + len;
    } else {
      out += ", " + s;
      last += len + 2;
    }
  }
  return os << out << ")";
}

}  // namespace phalanx
