// Runs mutwo's plot renderer (client/plot/mutwo_plot.py, matplotlib) on
// plot data: the one renderer of the CLI's plots and the benchmark's
// report. Where it is found:
//   $MUTWO_PLOT_SCRIPT, else <directory of the mutwo binary>/../share/mutwo/
//   mutwo_plot.py (the build tree and an installed tree have that layout).
// Which Python runs it: $MUTWO_PYTHON, else `python3` on PATH, then
// /usr/bin/python3 (Debian's, where python3-matplotlib installs) when the
// first has no matplotlib.
#ifndef MUTWO_CLIENT_PLOT_RENDER_H_
#define MUTWO_CLIENT_PLOT_RENDER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mutwo {

// NotFound (naming the places looked at) when there is no script.
[[nodiscard]] absl::StatusOr<std::string> FindPlotScript();

// Writes `json` to a temporary file and renders it to `out_path` (.svg,
// .png, .pdf; .pickle for a timeline's PyTorch memory snapshot), with
// `extra_args` after the paths. FailedPrecondition when no Python with
// matplotlib is found (the message says what to install); InvalidArgument
// when the renderer refuses the data or the path (its message is on
// stderr).
[[nodiscard]] absl::Status RenderPlot(
    const std::string& json, const std::string& out_path,
    const std::vector<std::string>& extra_args);

}  // namespace mutwo

#endif  // MUTWO_CLIENT_PLOT_RENDER_H_
