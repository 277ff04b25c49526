# frozen_string_literal: true

require "strscan"

module Strobe
  # The shape of an SQL statement: what it does, without the values in it.
  # String literals (standard '...' with '' inside, backslash-escaped as
  # MySQL writes them, E'...', N'...', X'...', B'...', U&'...', dollar
  # quotes $tag$...$tag$, MySQL's "...") and numbers (1_000, 0x1F, 0b101,
  # 0o17, 1.5e3, and whatever else starts with a digit; not $1 parameters)
  # become ?; comments (--, #, /* */, nested or not) go, since they may
  # hold values too; names in backticks, in SQLite's [...], and in double
  # quotes where they are names, stay when they are plain names (letters,
  # digits, _ and $), and become ? otherwise.
  #
  #   SQLShape.shape("SELECT * FROM users WHERE email = 'a@b.c' LIMIT 1")
  #   # => "SELECT * FROM users WHERE email = ? LIMIT ?"
  #
  # How a statement quotes depends on its database, which the statement
  # does not say: whether a backslash escapes the quote after it (MySQL:
  # yes; PostgreSQL and SQLite: no, unless PostgreSQL runs with
  # standard_conforming_strings off, or MySQL with NO_BACKSLASH_ESCAPES),
  # whether /* */ nest (PostgreSQL), whether # starts a comment (MySQL:
  # always, #> and #- too), whether -- needs a space after it (MySQL),
  # whether "..." is a string (MySQL, unless ANSI_QUOTES) or a name
  # (PostgreSQL, SQLite), and which of $tag$ (PostgreSQL), `...` (MySQL,
  # SQLite) and [...] (SQLite) quote. The statement is read in each way its dialect
  # (DIALECTS) may read it, or in all of them (READINGS) when the dialect
  # is not known, and whatever any reading takes for a literal or a
  # comment is hidden: a text is shown only where every reading agrees
  # that it is the statement's own. Where they disagree the shape loses
  # some of its statement (from the first disagreement on, at worst),
  # never a value. So without a dialect every "..." is hidden (Rails'
  # PostgreSQL and SQLite adapters quote every name so: give the dialect).
  module SQLShape
    # Bytes of a statement read at most: the rest is left out of its shape
    # (a literal cut there is hidden to its end like any unterminated one).
    # A shape is no longer than what was read, and markers keep 4,000
    # characters of it. Shaping runs in the query's thread, in each of up to
    # five readings: at 16 KiB a statement full of comments and quotes took
    # 20 to 90 ms, a bulk INSERT 3 to 5 ms; at 4 KiB a quarter of that.
    INPUT_LIMIT = 4 * 1024
    # What can be neither a literal, nor a quoted name, nor a comment.
    CODE = %r{[^'"`$/\-#\[]+}
    STANDARD_BODY = /(?>[^']+|'')*'?/
    ESCAPED_BODY = /(?>[^'\\]+|\\(?:.|\z)|'')*'?/m
    NAME_BODY = { '"' => /(?>[^"]+|"")*"?/, "`" => /(?>[^`]+|``)*`?/ }.freeze
    ESCAPED_NAME_BODY = { '"' => /(?>[^"\\]+|\\(?:.|\z)|"")*"?/m, "`" => NAME_BODY["`"] }.freeze
    # A quoted name shown as it is.
    PLAIN_NAME = /\A(?:(["`])[A-Za-z_][A-Za-z0-9_$]{0,62}\1|\[[A-Za-z_][A-Za-z0-9_$]{0,62}\])\z/
    BRACKET_BODY = /[^\]]*\]?/
    DOLLAR_TAG = /(?:[[:alpha:]_\u0080-\u{10FFFF}][[:alnum:]_\u0080-\u{10FFFF}]*)?\$/
    # A number: what starts with a digit (or "." and a digit) not within a
    # name nor after $ (a $1 parameter), to the end of its word and dots
    # (1_234, 0x1F, 0b101, 0o17, 1.5e-3, 10.0.0.1, 42abc).
    NUMBER = /(?<![[:word:]$])-?\.?\d(?:[[:word:].]|(?<=[eE])[+-](?=\d))*/
    # A way of reading a statement: backslash: whether \ escapes in '...'
    # (it always does in E'...'); quote_backslash: whether it does in
    # "..."; nested: whether /* */ nest; pound: whether # starts a comment;
    # string: whether "..." is a string; dollar: whether $tag$ starts a
    # dollar quote; backtick: whether `...` quotes a name; dash_space:
    # whether -- starts a comment only before a space or a control
    # character (MySQL); brackets: whether [...] quotes a name (SQLite).
    Reading = Struct.new(:backslash, :quote_backslash, :nested, :pound, :string, :dollar, :backtick, :dash_space,
                         :brackets, keyword_init: true) do
      # A Reading with every flag false but those given.
      def self.with(**flags)
        new(**members.to_h { |m| [m, false] }, **flags)
      end
    end
    POSTGRESQL = { nested: true, dollar: true }.freeze
    MYSQL = { pound: true, backtick: true, dash_space: true }.freeze
    # The ways each dialect is read: PostgreSQL (and with
    # standard_conforming_strings off), SQLite, MySQL (and with
    # NO_BACKSLASH_ESCAPES, ANSI_QUOTES or both).
    DIALECTS = {
      postgresql: [Reading.with(**POSTGRESQL), Reading.with(**POSTGRESQL, backslash: true)].freeze,
      sqlite: [Reading.with(backtick: true, brackets: true)].freeze,
      mysql: [Reading.with(**MYSQL, backslash: true, quote_backslash: true, string: true),
              Reading.with(**MYSQL, string: true),
              Reading.with(**MYSQL, backslash: true),
              Reading.with(**MYSQL)].freeze,
    }.freeze
    # The ways a statement of an unknown dialect is read.
    READINGS = DIALECTS.values.flatten.freeze
    # Active Record's adapter_name of each dialect.
    ADAPTERS = { /\A(?:postgresql|postgis)\z/i => :postgresql, /\Asqlite3?\z/i => :sqlite,
                 /\A(?:mysql2?|trilogy)\z/i => :mysql }.freeze

    module_function

    # sql (a String) in its shape, as above, read as dialect reads it
    # (:postgresql, :mysql, :sqlite; nil when not known).
    def shape(sql, dialect: nil)
      readings = dialect.nil? ? READINGS : DIALECTS.fetch(dialect) { raise ArgumentError, "unknown dialect #{dialect.inspect}" }
      sql = sql.to_s
      # (UTF-8 throughout: a dollar quote's tag may hold any character
      # above ASCII, which a UTF-8 pattern reads)
      sql = sql.dup.force_encoding(Encoding::UTF_8) if sql.encoding == Encoding::BINARY
      sql = sql.encode(Encoding::UTF_8, invalid: :replace, undef: :replace) unless sql.encoding == Encoding::UTF_8
      sql = sql.byteslice(0, INPUT_LIMIT) if sql.bytesize > INPUT_LIMIT
      sql = sql.scrub("?") unless sql.valid_encoding?
      build(sql, union(distinct(sql, readings).flat_map { |reading| hidden(sql, reading) }))
    end

    # The dialect of an Active Record adapter_name ("PostgreSQL", "SQLite",
    # "Mysql2", "Trilogy"), or nil.
    def dialect(adapter_name)
      ADAPTERS.find { |pattern, _| pattern.match?(adapter_name.to_s) }&.last
    end

    # The readings that read sql differently: without a backslash, with at
    # most one "/*", without "#" or without '"' in it, the readings that
    # differ only there agree (most statements are read once).
    def distinct(sql, readings)
      backslash = sql.include?("\\")
      nested = !(first = sql.index("/*")).nil? && !sql.index("/*", first + 2).nil?
      pound = sql.include?("#")
      string = sql.include?('"')
      dollar = sql.include?("$")
      backtick = sql.include?("`")
      dashes = sql.include?("--")
      brackets = sql.include?("[")
      readings.map do |r|
        Reading.new(backslash: backslash && r.backslash, quote_backslash: backslash && string && r.quote_backslash,
                    nested: nested && r.nested, pound: pound && r.pound, string: string && r.string,
                    dollar: dollar && r.dollar, backtick: backtick && r.backtick, dash_space: dashes && r.dash_space,
                    brackets: brackets && r.brackets)
      end.uniq
    end

    # What a Reading hides: [from, to, literal] byte ranges in order
    # (literal false for a comment).
    def hidden(sql, reading)
      backslash = reading.backslash
      s = StringScanner.new(sql)
      marks = []
      until s.eos?
        next if s.skip(CODE)

        from = s.pos
        case s.getch
        when "'"
          start, escapes = literal_start(sql, from)
          s.skip(backslash || escapes ? ESCAPED_BODY : STANDARD_BODY)
          marks << [start, s.pos, true]
        when '"', "`"
          quote = sql.byteslice(from, 1)
          next if quote == "`" && !reading.backtick # (an operator's character)

          s.skip((quote == '"' && reading.quote_backslash ? ESCAPED_NAME_BODY : NAME_BODY).fetch(quote))
          name = !(reading.string && quote == '"') && sql.byteslice(from, s.pos - from).match?(PLAIN_NAME)
          marks << [from, s.pos, true] unless name
        when "["
          next unless reading.brackets

          s.skip(BRACKET_BODY)
          marks << [from, s.pos, true] unless sql.byteslice(from, s.pos - from).match?(PLAIN_NAME)
        when "$"
          next if !reading.dollar || in_name?(sql, from) || !s.skip(DOLLAR_TAG)

          s.skip_until(Regexp.new(Regexp.escape(sql.byteslice(from, s.pos - from)))) or s.terminate
          marks << [from, s.pos, true]
        when "/"
          marks << [from, block_comment_end(s, nested: reading.nested), false] if s.skip(/\*/)
        when "-"
          next unless s.skip(/-/)
          # (MySQL: 1--2 is 1 - -2)
          next if reading.dash_space && !s.match?(/[[:space:][:cntrl:]]|\z/)

          marks << [from, line_end(s), false]
        when "#"
          marks << [from, line_end(s), false] if reading.pound
        end
      end
      marks
    end

    # Where the literal whose quote is at byte at begins (its prefix: E, N,
    # X, B, U&), and whether backslashes escape in it (E'...').
    def literal_start(sql, at)
      before = at.positive? ? sql.getbyte(at - 1) : nil
      if before == AMPERSAND && at >= 2 && U.include?(sql.getbyte(at - 2)) && !word_byte?(sql, at - 3)
        return [at - 2, false]
      end
      return [at, false] unless PREFIXES.include?(before) && !word_byte?(sql, at - 2)

      [at - 1, E.include?(before)]
    end

    AMPERSAND = "&".ord
    U = "uU".bytes.freeze
    E = "eE".bytes.freeze
    PREFIXES = "eEnNbBxX".bytes.freeze
    WORD_BYTES = [*"A".."Z", *"a".."z", *"0".."9", "_", "$"].map(&:ord).freeze

    # Whether the "$" at byte at continues a name (a$b$ in PostgreSQL is a
    # name, no quote): it follows a word that does not start with a digit
    # (after a number, 1$$...$$ is a number and a dollar quote).
    def in_name?(sql, at)
      start = at
      start -= 1 while word_byte?(sql, start - 1)
      start < at && !DIGITS.include?(sql.getbyte(start))
    end

    DIGITS = ("0".ord.."9".ord).freeze

    def word_byte?(sql, at)
      return false if at.negative?

      byte = sql.getbyte(at)
      !byte.nil? && (byte >= 0x80 || WORD_BYTES.include?(byte))
    end

    # After "/*": where the comment ends (PostgreSQL nests them, MySQL and
    # SQLite do not).
    def block_comment_end(s, nested:)
      depth = 1
      while depth.positive? && s.skip_until(nested ? %r{/\*|\*/} : %r{\*/})
        depth += s.matched == "/*" ? 1 : -1
      end
      s.terminate if depth.positive?
      s.pos
    end

    def line_end(s)
      s.skip(/[^\n]*/)
      s.pos
    end

    # The ranges of both readings as one list in order, those that overlap
    # or touch joined (a literal if any of them is).
    def union(marks)
      marks.sort!.each_with_object([]) do |(from, to, literal), joined|
        last = joined.last
        if last && from <= last[1]
          last[1] = to if to > last[1]
          last[2] ||= literal
        else
          joined << [from, to, literal]
        end
      end
    end

    # sql with each hidden literal as ?, each comment gone, numbers of what
    # is left as ?.
    def build(sql, hidden)
      out = +""
      at = 0
      hidden.each do |from, to, literal|
        out << sql.byteslice(at, from - at).gsub(NUMBER, "?")
        if literal
          out << "?"
        elsif sql.byteslice(to, 1).to_s.match?(/\A\s?\z/)
          out.rstrip! # (the space after the comment stays)
        elsif !out.empty? && !out.match?(/\s\z/)
          out << " " # (a comment between two words)
        end
        at = to
      end
      out << sql.byteslice(at, sql.bytesize - at).gsub(NUMBER, "?")
      out.strip
    end
  end
end
