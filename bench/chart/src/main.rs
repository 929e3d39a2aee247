//! The concurrency curve of bench/run as a PNG: requests/s against client
//! connections (log2 axis), one line per system.
//!
//! `bench-chart DATA.tsv OUT.png [TITLE]`
//!
//! DATA.tsv: one point a line, `system<TAB>connections<TAB>requests/s`
//! (what bench/report writes), systems in the order of the legend.
//! The font is a TTF file, `BENCH_CHART_FONT` or else DejaVu Sans from the
//! Debian package fonts-dejavu-core (bench/run installs it when missing).

use std::error::Error;
use std::process::ExitCode;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (1000, 600);
const COLORS: [RGBColor; 6] = [
    RGBColor(200, 30, 30),
    RGBColor(30, 90, 200),
    RGBColor(20, 150, 60),
    RGBColor(230, 140, 0),
    RGBColor(120, 60, 170),
    RGBColor(90, 90, 90),
];

/// One system's line: its name and (log2 of connections, requests/s).
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
}

/// The lines of DATA.tsv, in the order their systems first appear.
fn parse(text: &str) -> Result<Vec<Line>, String> {
    let mut lines: Vec<Line> = Vec::new();
    for (n, row) in text.lines().enumerate().filter(|(_, row)| !row.trim().is_empty()) {
        let fields: Vec<&str> = row.split('\t').collect();
        let point = match fields[..] {
            [_, c, rps] => c.trim().parse::<f64>().ok().zip(rps.trim().parse::<f64>().ok()),
            _ => None,
        };
        let Some((connections, rps)) = point.filter(|(c, r)| *c >= 1.0 && r.is_finite()) else {
            return Err(format!("line {}: expected system, connections, requests/s", n + 1));
        };
        let name = fields[0].to_string();
        let index = lines.iter().position(|l| l.name == name).unwrap_or_else(|| {
            lines.push(Line { name, points: Vec::new() });
            lines.len() - 1
        });
        lines[index].points.push((connections.log2(), rps));
    }
    lines.iter_mut().for_each(|l| l.points.sort_by(|a, b| a.0.total_cmp(&b.0)));
    Ok(lines)
}

/// Draws the lines into an RGB buffer of SIZE.
fn draw(lines: &[Line], title: &str, buffer: &mut [u8]) -> Result<(), Box<dyn Error>> {
    let all = lines.iter().flat_map(|l| l.points.iter());
    let (x_min, x_max, y_max) =
        all.fold((f64::MAX, f64::MIN, 0.0_f64), |(a, b, c), &(x, y)| (a.min(x), b.max(x), c.max(y)));
    let (x_min, x_max) = (x_min.floor(), x_max.ceil().max(x_min.floor() + 1.0));
    let root = BitMapBackend::with_buffer(buffer, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x_min..x_max, 0.0..(y_max * 1.1).max(1.0))?;
    // Ticks at powers of two only: the axis is log2 of the connections.
    let power = |x: &f64| if x.fract() == 0.0 { format!("{}", 2f64.powf(*x)) } else { String::new() };
    chart
        .configure_mesh()
        .x_labels((x_max - x_min) as usize + 1)
        .x_label_formatter(&power)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("client connections (log2 scale)")
        .y_desc("requests/s")
        .light_line_style(WHITE)
        .label_style(("sans-serif", 16))
        .draw()?;
    for (line, color) in lines.iter().zip(COLORS.iter().cycle()) {
        let style = color.stroke_width(3);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))?
            .label(line.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
        chart.draw_series(line.points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn write_png(path: &str, buffer: &[u8]) -> Result<(), Box<dyn Error>> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, SIZE.0, SIZE.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // The charts are committed beside their reports: keep them small.
    encoder.set_compression(png::Compression::Best);
    encoder.write_header()?.write_image_data(buffer)?;
    Ok(())
}

fn run(data: &str, out: &str, title: &str) -> Result<(), Box<dyn Error>> {
    let font = std::env::var("BENCH_CHART_FONT").unwrap_or_else(|_| DEFAULT_FONT.to_string());
    let bytes = std::fs::read(&font).map_err(|e| format!("cannot read the font {font}: {e}"))?;
    // plotters keeps registered fonts for the whole run.
    register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| format!("{font}: not a font ab_glyph can read"))?;
    let text = std::fs::read_to_string(data).map_err(|e| format!("cannot read {data}: {e}"))?;
    let lines = parse(&text)?;
    if lines.is_empty() {
        return Err(format!("{data}: no points").into());
    }
    let mut buffer = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    draw(&lines, title, &mut buffer)?;
    write_png(out, &buffer)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (data, out, title) = match args.as_slice() {
        [data, out] => (data, out, "requests/s against client connections"),
        [data, out, title] => (data, out, title.as_str()),
        _ => {
            eprintln!("usage: bench-chart DATA.tsv OUT.png [TITLE]");
            return ExitCode::from(2);
        }
    };
    match run(data, out, title) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-chart: {e}");
            ExitCode::FAILURE
        }
    }
}
