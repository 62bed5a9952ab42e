#include "observe/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "observe/runs.h"

namespace st::observe {

namespace fs = std::filesystem;

namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// Tick label: 3 significant digits, k/M/G for large values.
std::string Tick(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.3gG", v / 1e9);
  else if (a >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.3gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(buf, sizeof(buf), "%.3gk", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

// Runs argv with no shell; true when it exits 0.
bool RunProgram(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    std::FILE* devnull = std::fopen("/dev/null", "w");
    if (devnull) {
      ::dup2(fileno(devnull), 1);
      ::dup2(fileno(devnull), 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / program;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

std::string PlotSvg(const std::string& title, const std::string& x_label,
                    const std::vector<Panel>& panels) {
  constexpr double kW = 900, kPanelH = 300, kTop = 50, kLeft = 80, kRight = 30, kGap = 40;
  const double height = kTop + panels.size() * (kPanelH + kGap) + 20;
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << kW << " " << height
    << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kW / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
    << Escape(title) << "</text>\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    const Panel& panel = panels[p];
    const double y0 = kTop + p * (kPanelH + kGap) + 20;  // plot area top
    const double ph = kPanelH - 50, pw = kW - kLeft - kRight;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (const Series& s : panel.series)
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        xmin = std::min(xmin, x), xmax = std::max(xmax, x);
        ymin = std::min(ymin, y), ymax = std::max(ymax, y);
      }
    if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
    if (xmax == xmin) xmax = xmin + 1;
    if (ymin > 0 && ymin < 0.5 * ymax) ymin = 0;  // anchor at zero when it costs little
    if (ymax == ymin) ymax = ymin + 1;
    const double pad = (ymax - ymin) * 0.05;
    ymax += pad;
    if (ymin != 0) ymin -= pad;
    auto X = [&](double x) { return kLeft + (x - xmin) / (xmax - xmin) * pw; };
    auto Y = [&](double y) { return y0 + ph - (y - ymin) / (ymax - ymin) * ph; };
    o << "<g class=\"panel\">\n"
      << "<text x=\"" << kLeft << "\" y=\"" << y0 - 8 << "\" font-size=\"14\">"
      << Escape(panel.title) << "</text>\n";
    for (int t = 0; t <= 4; ++t) {
      const double yv = ymin + (ymax - ymin) * t / 4, xv = xmin + (xmax - xmin) * t / 4;
      o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + pw << "\" y1=\"" << Num(Y(yv))
        << "\" y2=\"" << Num(Y(yv)) << "\" stroke=\"#e5e5e5\"/>\n"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << Num(Y(yv) + 4)
        << "\" text-anchor=\"end\" fill=\"#555\">" << Tick(yv) << "</text>\n"
        << "<text x=\"" << Num(X(xv)) << "\" y=\"" << y0 + ph + 16
        << "\" text-anchor=\"middle\" fill=\"#555\">"
        << Tick(xmax - xmin >= 8 ? std::round(xv) : xv) << "</text>\n";
    }
    o << "<rect x=\"" << kLeft << "\" y=\"" << y0 << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#999\"/>\n"
      << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << y0 + ph + 32
      << "\" text-anchor=\"middle\" fill=\"#333\">" << Escape(x_label) << "</text>\n"
      << "<text transform=\"translate(16," << Num(y0 + ph / 2)
      << ") rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">" << Escape(panel.y_label)
      << "</text>\n";
    double legend_x = kLeft + pw;
    for (size_t si = panel.series.size(); si-- > 0;) {
      const Series& s = panel.series[si];
      std::string pts;
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y)) pts += Num(X(x)) + "," + Num(Y(y)) + " ";
      // Sparse series (a point per epoch) get a marker on every point.
      if (s.points.size() <= 20)
        for (const auto& [x, y] : s.points)
          if (std::isfinite(x) && std::isfinite(y))
            o << "<circle cx=\"" << Num(X(x)) << "\" cy=\"" << Num(Y(y)) << "\" r=\"3\" fill=\""
              << s.color << "\"/>\n";
      if (s.points.size() > 1)
        o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\" points=\""
          << pts << "\"/>\n";
      legend_x -= 9.0 * s.name.size() + 30;
      o << "<rect x=\"" << Num(legend_x) << "\" y=\"" << y0 - 18
        << "\" width=\"12\" height=\"4\" fill=\"" << s.color << "\"/>\n"
        << "<text x=\"" << Num(legend_x + 16) << "\" y=\"" << y0 - 12 << "\" fill=\"#333\">"
        << Escape(s.name) << "</text>\n";
    }
    o << "</g>\n";
  }
  o << "</svg>\n";
  return o.str();
}

StatusOr<std::vector<std::string>> WriteTrainingCurves(const std::string& run_dir,
                                                       const std::string& run_name) {
  const MetricsLog log = ReadMetricsLog(run_dir);
  Series loss{"loss per step", "#1f77b4", {}}, epoch_loss{"epoch mean", "#d62728", {}};
  Series padded{"tokens/s (padded)", "#2ca02c", {}}, real{"tokens/s (real)", "#ff7f0e", {}};
  for (const auto& s : log.steps) {
    const double step = s.value("step", 0.0);
    loss.points.push_back({step, s.value("loss", 0.0)});
    padded.points.push_back({step, s.value("tokens_per_s", 0.0)});
    real.points.push_back({step, s.value("real_tokens_per_s", 0.0)});
  }
  for (const auto& e : log.epochs)
    epoch_loss.points.push_back({e.value("global_step", 0.0), e.value("loss", 0.0)});
  Series eval{"eval loss (held-out)", "#9467bd", {}};
  for (const auto& e : log.evals)
    eval.points.push_back({e.value("step", 0.0), e.value("eval_loss", 0.0)});
  std::vector<Series> losses = {loss, epoch_loss};
  if (!eval.points.empty()) losses.push_back(eval);
  const std::string svg =
      PlotSvg("slicetrain: " + run_name, "global step",
              {{"Training loss", "loss", losses}, {"Throughput", "tokens / s", {padded, real}}});
  std::vector<std::string> written;
  const std::string svg_path = (fs::path(run_dir) / "training_curves.svg").string();
  {
    std::ofstream out(svg_path);
    out << svg;
    if (!out) return IoError("cannot write " + svg_path);
  }
  written.push_back(svg_path);
  const std::string png_path = (fs::path(run_dir) / "training_curves.png").string();
  bool png = false;
  if (const std::string rsvg = FindOnPath("rsvg-convert"); !rsvg.empty())
    png = RunProgram({rsvg, "-o", png_path, svg_path});
  if (!png)
    if (const std::string convert = FindOnPath("convert"); !convert.empty())
      png = RunProgram({convert, svg_path, png_path});
  std::error_code ec;
  if (png && fs::exists(png_path, ec)) written.push_back(png_path);
  return written;
}

}  // namespace st::observe
