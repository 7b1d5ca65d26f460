#include "client/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/parse.h"

namespace mutwo {
namespace {

constexpr double kWidth = 800, kHeight = 450;
constexpr double kLeft = 90, kRight = 20, kTop = 40, kBottom = 60;

std::string Escape(const std::string& text) {
  return absl::StrReplaceAll(
      text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

// A "nice" step (1, 2, 5 x 10^k) giving about `ticks` ticks over `span`.
double NiceStep(double span, int ticks) {
  if (span <= 0) return 1;
  const double raw = span / ticks;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

}  // namespace

std::string RenderSvg(const LineChart& chart) {
  double x_min = std::numeric_limits<double>::max(), x_max = -x_min;
  double y_max = chart.y_line;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  }
  if (x_min > x_max) x_min = 0, x_max = 1;
  if (x_max == x_min) x_max = x_min + 1;
  if (y_max <= 0) y_max = 1;
  y_max *= 1.08;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) {
    return kLeft + (x - x_min) / (x_max - x_min) * pw;
  };
  auto py = [&](double y) { return kTop + ph - y / y_max * ph; };

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"15\" "
      "text-anchor=\"middle\">%s</text>\n",
      kWidth, kHeight, kWidth, kHeight, kWidth / 2, Escape(chart.title));
  // Y axis ticks in binary units.
  const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  const double unit = y_max >= 2 * gib ? gib : (y_max >= 2 * mib ? mib : 1024);
  const char* unit_name = unit == gib ? "GiB" : (unit == mib ? "MiB" : "KiB");
  const double step = NiceStep(y_max / unit, 5) * unit;
  for (double y = 0; y <= y_max; y += step) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#ddd\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n",
        kLeft, py(y), kWidth - kRight, py(y), kLeft - 6, py(y) + 4, y / unit,
        unit_name);
  }
  const double xstep = NiceStep(x_max - x_min, 8);
  for (double x = std::ceil(x_min / xstep) * xstep; x <= x_max; x += xstep) {
    absl::StrAppendFormat(
        &svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
        px(x), kTop + ph + 18, x);
  }
  absl::StrAppendFormat(
      &svg,
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
      "fill=\"none\" "
      "stroke=\"#333\"/>\n"
      "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n"
      "<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 16 %.0f)\">%s</text>\n",
      kLeft, kTop, pw, ph, kLeft + pw / 2, kHeight - 15, Escape(chart.x_label),
      kTop + ph / 2, kTop + ph / 2, Escape(chart.y_label));
  for (const auto& m : chart.markers) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#888\" "
        "stroke-dasharray=\"4 3\"/><text x=\"%.1f\" y=\"%.0f\" "
        "fill=\"#555\">%s</text>\n",
        px(m.x), kTop, px(m.x), kTop + ph, px(m.x) + 4, kTop + 14,
        Escape(m.label));
  }
  if (chart.y_line > 0) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#c00\" "
        "stroke-dasharray=\"6 4\"/><text x=\"%.0f\" y=\"%.1f\" fill=\"#c00\" "
        "text-anchor=\"end\">%s</text>\n",
        kLeft, py(chart.y_line), kWidth - kRight, py(chart.y_line),
        kWidth - kRight - 4, py(chart.y_line) - 4, Escape(chart.y_line_label));
  }
  double legend_y = kTop + 14;
  for (const auto& s : chart.series) {
    if (s.points.empty()) continue;
    std::string pts;
    for (const auto& [x, y] : s.points) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(x), py(y));
    }
    absl::StrAppendFormat(
        &svg,
        "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s "
        "points=\"%s\"><title>%s</title></polyline>\n",
        s.color, s.dashed ? " stroke-dasharray=\"6 3\"" : "", pts,
        Escape(s.name));
    if (s.markers) {
      for (const auto& [x, y] : s.points) {
        absl::StrAppendFormat(
            &svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
            px(x), py(y), s.color);
      }
    }
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
        "stroke-width=\"3\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
        kWidth - kRight - 200, legend_y, kWidth - kRight - 180, legend_y,
        s.color, kWidth - kRight - 175, legend_y + 4, Escape(s.name));
    legend_y += 16;
  }
  svg += "</svg>\n";
  return svg;
}

LineChart TimelineChart(const v1::Schedule& schedule, int forward_positions,
                        const std::string& model_name) {
  LineChart chart;
  chart.title = absl::StrCat("Memory over one training step: ", model_name,
                             ", batch ", schedule.batch_size());
  chart.x_label = "timeline position (forward nodes, then backward steps)";
  chart.y_label = "allocated memory";
  ChartSeries baseline{"baseline (no checkpointing)", "#1f77b4", {}};
  ChartSeries planned{
      absl::StrCat("planned (", v1::Policy_Name(schedule.policy()), ")"),
      "#ff7f0e",
      {}};
  for (const auto& s : schedule.timeline()) {
    baseline.points.emplace_back(s.position(),
                                 static_cast<double>(s.baseline_bytes()));
    planned.points.emplace_back(s.position(),
                                static_cast<double>(s.planned_bytes()));
  }
  chart.series = {baseline, planned};
  if (forward_positions > 0)
    chart.markers.push_back({double(forward_positions), "backward"});
  chart.y_line = static_cast<double>(schedule.budget_bytes());
  chart.y_line_label =
      absl::StrCat("budget ", FormatBytes(schedule.budget_bytes()));
  return chart;
}

LineChart BatchChart(const v1::Job& job) {
  LineChart chart;
  chart.title =
      absl::StrCat("Peak memory vs batch size: ", job.spec().model_name());
  chart.x_label = "batch size";
  chart.y_label = "peak memory";
  ChartSeries baseline{
      "baseline (measured by profiling)", "#1f77b4", {}, false, true};
  ChartSeries planned{
      "tightest feasible schedule (predicted)", "#ff7f0e", {}, true, true};
  ChartSeries measured{
      "tightest schedule (measured)", "#2ca02c", {}, false, true};
  for (const auto& r : job.results()) {
    if (r.baseline_peak_bytes() <= 0) continue;
    const double b = static_cast<double>(r.batch_size());
    baseline.points.emplace_back(b,
                                 static_cast<double>(r.baseline_peak_bytes()));
    int64_t best = 0, best_budget = 0;
    for (const auto& s : r.schedules()) {
      if (s.feasible() && (best == 0 || s.predicted_peak_bytes() < best)) {
        best = s.predicted_peak_bytes();
        best_budget = s.budget_bytes();
      }
    }
    if (best > 0) planned.points.emplace_back(b, static_cast<double>(best));
    // The last round's measurement (the closed loop may run several).
    const v1::Validation* last = nullptr;
    for (const auto& v : r.validations()) {
      if (v.budget_bytes() == best_budget && v.scheduled().peak_bytes() > 0) {
        last = &v;
      }
    }
    if (last != nullptr) {
      measured.points.emplace_back(
          b, static_cast<double>(last->scheduled().peak_bytes()));
    }
  }
  chart.series = {baseline, planned, measured};
  double max_peak = 0;
  for (const auto& [x, y] : baseline.points) max_peak = std::max(max_peak, y);
  // A capacity far above every point (a CPU worker's host memory) would
  // flatten the curves; draw it only when it is in range.
  if (job.has_max_batch() && job.max_batch().capacity_bytes() > 0 &&
      job.max_batch().capacity_bytes() <= 4 * max_peak) {
    chart.y_line = static_cast<double>(job.max_batch().capacity_bytes());
    chart.y_line_label = absl::StrCat(
        "capacity ", FormatBytes(job.max_batch().capacity_bytes()));
  }
  return chart;
}

}  // namespace mutwo
