//! A reply's text as the voice can send it: Discord takes at most [`MESSAGE_LIMIT`]
//! characters a message, so a longer reply goes out as several.

/// Discord's longest message, in characters.
pub const MESSAGE_LIMIT: usize = 2_000;

/// Splits `text` into pieces of at most `limit` characters, preferring to break at a
/// paragraph, then a line, then a space; never inside a character. Whitespace at a cut
/// is dropped; no piece is empty.
pub fn split_message(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(1);
    let mut out = Vec::new();
    let mut rest = text.trim();
    while rest.chars().count() > limit {
        // The byte offset just past `limit` characters.
        let hard = rest
            .char_indices()
            .nth(limit)
            .map_or(rest.len(), |(i, _)| i);
        let window = &rest[..hard];
        let cut = ["\n\n", "\n", " "]
            .iter()
            .find_map(|sep| window.rfind(sep).filter(|&i| i > 0))
            .unwrap_or(hard);
        let piece = rest[..cut].trim_end();
        if !piece.is_empty() {
            out.push(piece.to_owned());
        }
        rest = rest[cut..].trim_start();
    }
    if !rest.is_empty() {
        out.push(rest.to_owned());
    }
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_piece() {
        assert_eq!(split_message("hello", 2000), vec!["hello"]);
    }

    #[test]
    fn long_text_breaks_at_paragraphs_then_lines_then_spaces() {
        let para = "word ".repeat(300); // 1500 chars
        let text = format!("{para}\n\n{para}\n{para}");
        let parts = split_message(&text, MESSAGE_LIMIT);
        assert!(parts.iter().all(|p| p.chars().count() <= MESSAGE_LIMIT));
        assert_eq!(parts.len(), 3);
        let words: usize = parts.iter().map(|p| p.split_whitespace().count()).sum();
        assert_eq!(words, 900, "nothing lost");
    }

    #[test]
    fn text_without_spaces_is_cut_between_characters() {
        let text = "é".repeat(4_500);
        let parts = split_message(&text, MESSAGE_LIMIT);
        assert_eq!(parts.len(), 3);
        assert_eq!(
            parts.iter().map(|p| p.chars().count()).sum::<usize>(),
            4_500
        );
    }
}
