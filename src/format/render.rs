//! Pictures: an SVG that wgmoe wrote, as the file a name asks for (`.svg` as it is, `.png`
//! rasterised by resvg). Text is set in the DejaVu Sans subset shipped in `assets/fonts`
//! (printable ASCII and a few symbols), so a PNG looks the same on every machine and needs
//! no system fonts.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// DejaVu Sans, printable ASCII (see `assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-ascii.ttf");

/// PNGs are drawn at twice the SVG's size, for screens that scale.
pub const PNG_SCALE: f32 = 2.0;

/// What a file name asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Svg,
    Png,
}

/// The format of `path` from its extension; any other extension is an error naming
/// `option`.
pub fn format_of(option: &str, path: &Path) -> Result<ImageFormat> {
    match path
        .extension()
        .map(|x| x.to_string_lossy().to_ascii_lowercase())
        .as_deref()
    {
        Some("svg") => Ok(ImageFormat::Svg),
        Some("png") => Ok(ImageFormat::Png),
        _ => Err(Error::option(
            option,
            format!(
                "{}: give a file name ending in .svg or .png",
                path.display()
            ),
        )),
    }
}

/// `svg` as a PNG at `scale` times its size.
pub fn svg_to_png(svg: &str, scale: f32) -> Result<Vec<u8>> {
    let mut opt = resvg::usvg::Options::default();
    let mut db = resvg::usvg::fontdb::Database::new();
    db.load_font_data(FONT.to_vec());
    db.set_sans_serif_family("DejaVu Sans");
    opt.fontdb = Arc::new(db);
    opt.font_family = "DejaVu Sans".to_string();
    let tree = resvg::usvg::Tree::from_str(svg, &opt)
        .map_err(|e| Error::Other(format!("internal: the SVG does not parse: {e}")))?;
    let size = tree
        .size()
        .to_int_size()
        .scale_by(scale)
        .ok_or_else(|| Error::Other("internal: the picture has no size".to_string()))?;
    let mut pixmap =
        resvg::tiny_skia::Pixmap::new(size.width(), size.height()).ok_or_else(|| {
            Error::Other(format!(
                "a {}x{} picture is too large",
                size.width(),
                size.height()
            ))
        })?;
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap
        .encode_png()
        .map_err(|e| Error::Other(format!("PNG encoding: {e}")))
}

/// The bytes of `svg` as the file `path` names (`option` names it in errors).
pub fn image_bytes(option: &str, path: &Path, svg: &str) -> Result<Vec<u8>> {
    match format_of(option, path)? {
        ImageFormat::Svg => Ok(svg.as_bytes().to_vec()),
        ImageFormat::Png => svg_to_png(svg, PNG_SCALE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_text_and_shapes_become_pixels() {
        let svg = r##"<svg xmlns="http://www.w3.org/2000/svg" width="60" height="20"><rect width="60" height="20" fill="white"/><rect x="0" y="0" width="10" height="10" fill="#ff0000"/><text x="20" y="15" font-family="sans-serif" font-size="14">Ag</text></svg>"##;
        let png = svg_to_png(svg, 1.0).unwrap();
        let p = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        assert_eq!((p.width(), p.height()), (60, 20));
        let px = |x: u32, y: u32| p.pixel(x, y).unwrap();
        assert_eq!((px(5, 5).red(), px(5, 5).green()), (255, 0));
        assert_eq!(px(50, 3).red(), 255, "white background");
        // The text drew dark pixels where the font put its glyphs.
        let dark = (20..50)
            .flat_map(|x| (0..20).map(move |y| (x, y)))
            .filter(|&(x, y)| px(x, y).red() < 128)
            .count();
        assert!(dark > 10, "{dark} dark pixels: no text drawn");
        assert!(format_of("-o", Path::new("a.jpg")).is_err());
        assert_eq!(
            format_of("-o", Path::new("a.PNG")).unwrap(),
            ImageFormat::Png
        );
    }
}
