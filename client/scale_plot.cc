#include "client/scale_plot.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::client {
namespace {

using loom::v1::ScalePoint;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One panel's plotting area.
struct Box {
  double x, y, w, h;
};

constexpr Box kLeft{70, 60, 330, 250};
constexpr Box kRight{500, 60, 330, 250};

struct Bucket {
  const char* name;
  const char* color;
  double (*get)(const loom::v1::ScalingLoss&);
};

const Bucket kBuckets[] = {
    {"exposed communication", "#d95f02",
     [](const loom::v1::ScalingLoss& l) { return l.comm_exposed(); }},
    {"pipeline bubble", "#7570b3", [](const loom::v1::ScalingLoss& l) { return l.bubble(); }},
    {"imbalance", "#e7298a", [](const loom::v1::ScalingLoss& l) { return l.imbalance(); }},
    {"compute inflation", "#1b9e77", [](const loom::v1::ScalingLoss& l) { return l.rest(); }},
    {"unexplained", "#999999", [](const loom::v1::ScalingLoss& l) { return l.unexplained(); }},
};

void Axes(std::string& svg, const Box& b, const std::string& title, const std::string& y_label,
          double y_max) {
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\" "
                        "font-weight=\"bold\">%s</text>\n",
                        b.x + b.w / 2, b.y - 20, Escape(title));
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                        "stroke=\"#333\"/>\n",
                        b.x, b.y, b.w, b.h);
  for (int i = 0; i <= 4; ++i) {
    const double v = y_max * i / 4;
    const double y = b.y + b.h - b.h * i / 4;
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s"
        "</text>\n",
        b.x, y, b.x + b.w, y, b.x - 6, y + 4, absl::StrFormat("%.2f", v));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
                        b.x - 45, b.y + b.h / 2, b.x - 45, b.y + b.h / 2, Escape(y_label));
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                        "text-anchor=\"middle\">devices</text>\n",
                        b.x + b.w / 2, b.y + b.h + 34);
}

}  // namespace

std::string ScalingSvg(const loom::v1::ScaleTest& test) {
  std::vector<const ScalePoint*> points;
  for (const ScalePoint& p : test.points()) {
    if (p.measured()) points.push_back(&p);
  }
  const int n = static_cast<int>(points.size());
  std::string svg =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"880\" height=\"430\" "
      "viewBox=\"0 0 880 430\" font-family=\"sans-serif\">\n"
      "<rect width=\"880\" height=\"430\" fill=\"white\"/>\n";
  const std::string job = test.spec().name().empty() ? "job" : test.spec().name();
  absl::StrAppendFormat(&svg,
                        "<text x=\"440\" y=\"18\" font-size=\"13\" text-anchor=\"middle\">%s "
                        "scaling of %s (%s, %d steps per size)</text>\n",
                        test.weak() ? "weak" : "strong", Escape(job), Escape(test.name()),
                        test.steps());

  // Left: efficiency.
  double eff_max = 1.2;
  for (const ScalePoint* p : points) eff_max = std::max(eff_max, p->efficiency() * 1.1);
  Axes(svg, kLeft, "efficiency against linear", "efficiency", eff_max);
  auto x_of = [&](const Box& b, int i) { return b.x + b.w * (i + 0.5) / std::max(1, n); };
  auto y_eff = [&](double v) { return kLeft.y + kLeft.h - kLeft.h * v / eff_max; };
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" "
                        "stroke-dasharray=\"6 4\"/>\n"
                        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#888\" "
                        "text-anchor=\"end\">linear</text>\n",
                        kLeft.x, y_eff(1), kLeft.x + kLeft.w, y_eff(1), kLeft.x + kLeft.w - 4,
                        y_eff(1) - 4);
  if (test.efficiency_threshold() > 0) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                          "stroke-dasharray=\"2 3\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#c00\" "
                          "text-anchor=\"end\">SCALING threshold %.2f</text>\n",
                          kLeft.x, y_eff(test.efficiency_threshold()), kLeft.x + kLeft.w,
                          y_eff(test.efficiency_threshold()), kLeft.x + kLeft.w - 4,
                          y_eff(test.efficiency_threshold()) - 4, test.efficiency_threshold());
  }
  std::string line;
  for (int i = 0; i < n; ++i) {
    absl::StrAppendFormat(&line, "%s%.1f,%.1f", i == 0 ? "" : " ", x_of(kLeft, i),
                          y_eff(points[i]->efficiency()));
  }
  if (n > 0) {
    absl::StrAppendFormat(&svg,
                          "<polyline points=\"%s\" fill=\"none\" stroke=\"#1f77b4\" "
                          "stroke-width=\"2\"/>\n",
                          line);
  }
  for (int i = 0; i < n; ++i) {
    const double x = x_of(kLeft, i), y = y_eff(points[i]->efficiency());
    absl::StrAppendFormat(&svg,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f77b4\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                          "text-anchor=\"middle\">%.2f</text>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                          "text-anchor=\"middle\">%d</text>\n",
                          x, y, x, y - 9, points[i]->efficiency(), x, kLeft.y + kLeft.h + 16,
                          points[i]->devices());
  }

  // Right: where the lost time went, as a fraction of each size's step.
  double frac_max = 0.1;
  for (const ScalePoint* p : points) {
    double pos = 0;
    for (const Bucket& b : kBuckets) pos += std::max(0.0, b.get(p->loss()) / p->step_seconds());
    frac_max = std::max(frac_max, pos * 1.1);
  }
  Axes(svg, kRight, "time lost against linear (fraction of the step)", "fraction of the step",
       frac_max);
  const double bar = kRight.w / std::max(1, n) * 0.5;
  for (int i = 0; i < n; ++i) {
    const ScalePoint& p = *points[i];
    double y = kRight.y + kRight.h;
    const double x = x_of(kRight, i) - bar / 2;
    for (const Bucket& b : kBuckets) {
      // Negative buckets (faster than ideal) cannot be stacked; they are listed in the tooltip.
      const double frac = std::max(0.0, b.get(p.loss()) / p.step_seconds());
      const double h = kRight.h * frac / frac_max;
      if (h <= 0) continue;
      y -= h;
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"%s\"><title>%d devices, %s: %.4f s (%.1f%% of the step)"
                            "</title></rect>\n",
                            x, y, bar, h, b.color, p.devices(), b.name, b.get(p.loss()),
                            100 * frac);
    }
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                          "text-anchor=\"middle\">%d</text>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                          "text-anchor=\"middle\">lost %.0f%%</text>\n",
                          x + bar / 2, kRight.y + kRight.h + 16, p.devices(), x + bar / 2, y - 4,
                          100 * p.loss().lost_seconds() / p.step_seconds());
  }
  // Legend.
  double lx = 40;
  for (const Bucket& b : kBuckets) {
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"395\" width=\"12\" height=\"12\" fill=\"%s\"/>\n"
                          "<text x=\"%.1f\" y=\"405\" font-size=\"12\">%s</text>\n",
                          lx, b.color, lx + 16, b.name);
    lx += 40 + 7.0 * std::string(b.name).size();
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace loom::client
