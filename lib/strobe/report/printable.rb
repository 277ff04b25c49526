# frozen_string_literal: true

# Text as it is safe to show on a terminal: Report.printable, through which
# every text report (and every message quoting a name) writes names, and the
# source lines of the annotated-source reports.

module Strobe
  class Report
    # Report.printable (Report extends this).
    module Printable
      # Characters a terminal may act on rather than show: C0 controls, DEL
      # and C1 controls (U+0080 to U+009F).
      CONTROL = /[\x00-\x1f\x7f\u0080-\u009f]/
      CONTROL_BUT_TAB = /[\x00-\x08\x0a-\x1f\x7f\u0080-\u009f]/
      NAMED_ESCAPES = { "\e" => "\\e", "\n" => "\\n", "\r" => "\\r", "\t" => "\\t" }.freeze

      # text (a frame, file or thread name, a message quoting one) as it is
      # safe to show on a terminal, in UTF-8: ESC, newline, carriage return
      # and tab as \e \n \r \t, other C0 controls and DEL as \xNN, C1
      # controls as \uNNNN, and bytes that are not UTF-8 as \xNN (the notation
      # of Ruby's String#inspect; backslashes themselves are left as they are).
      # Text in another encoding is converted to UTF-8 first. Every text
      # report writes names through this (ext/strobe/out.c has the same rules
      # in C, for the reports written there). keep_tabs: leaves tabs as they
      # are (for source code).
      def printable(text, keep_tabs: false)
        control = keep_tabs ? CONTROL_BUT_TAB : CONTROL
        str = utf8_text(text.to_s)
        return str if str.valid_encoding? && !str.match?(control)

        str.scrub { |bytes| bytes.unpack("C*").map { |byte| format("\\x%02X", byte) }.join }.gsub(control) do |c|
          NAMED_ESCAPES[c] || format(c.ord < 0x80 ? "\\x%02X" : "\\u%04X", c.ord)
        end
      end

      private

      # str's text in UTF-8: str itself; a String in US-ASCII or binary with
      # its bytes taken for UTF-8; another encoding converted, or its bytes
      # taken for UTF-8 where it cannot be.
      def utf8_text(str)
        return str if str.encoding == Encoding::UTF_8
        return str.dup.force_encoding(Encoding::UTF_8) if [Encoding::US_ASCII, Encoding::BINARY].include?(str.encoding)

        str.encode(Encoding::UTF_8)
      rescue EncodingError
        str.b.force_encoding(Encoding::UTF_8)
      end
    end

    # What ReportSource prints (source lines, and the file's name when it
    # cannot be read), made printable on its way to io; tabs, which source
    # code has, are kept.
    class PrintableLines
      def initialize(io)
        @io = io
      end

      def puts(line)
        @io.puts(Report.printable(line, keep_tabs: true))
      end
    end
    private_constant :PrintableLines
  end
end
