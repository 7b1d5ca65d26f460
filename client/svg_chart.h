// Minimal SVG line charts for `mutwo plot`: memory timeline before/after a
// schedule, and peak memory vs batch size with and without one. Pure
// functions of their inputs (no I/O), so tests can check the output.
#ifndef MUTWO_CLIENT_SVG_CHART_H_
#define MUTWO_CLIENT_SVG_CHART_H_

#include <string>
#include <utility>
#include <vector>

#include "mutwo/v1/types.pb.h"

namespace mutwo {

struct ChartSeries {
  std::string name;
  std::string color;                              // CSS color
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  bool dashed = false;
  bool markers = false;
};

struct ChartMarker {
  double x = 0;
  std::string label;  // vertical line with a label ("backward starts")
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;  // values are bytes, shown in binary units
  std::vector<ChartSeries> series;
  std::vector<ChartMarker> markers;
  double y_line = 0;  // horizontal reference (budget, capacity); 0: none
  std::string y_line_label;
};

std::string RenderSvg(const LineChart& chart);

// The simulated memory timeline of a schedule (baseline vs planned), with
// the forward/backward boundary at `forward_positions`.
LineChart TimelineChart(const v1::Schedule& schedule, int forward_positions,
                        const std::string& model_name);
// Peak memory vs batch size: baseline, planned (predicted) and measured
// (validations), with the device capacity from the max-batch prediction.
LineChart BatchChart(const v1::Job& job);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_SVG_CHART_H_
