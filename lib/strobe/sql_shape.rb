# frozen_string_literal: true

require "strscan"

module Strobe
  # The shape of an SQL statement: what it does, without the values in it.
  # String literals (standard '...' with '' inside, backslash-escaped as
  # MySQL writes them, E'...', N'...', X'...', B'...', U&'...', dollar
  # quotes $tag$...$tag$) and numbers become ?; comments (--, #, /* */,
  # nested or not) go, since they may hold values too; names in double
  # quotes or backticks stay when they are plain names (letters, digits,
  # _ and $), and become ? otherwise (MySQL reads "..." as a string).
  #
  #   SQLShape.shape("SELECT * FROM users WHERE email = 'a@b.c' LIMIT 1")
  #   # => "SELECT * FROM users WHERE email = ? LIMIT ?"
  #
  # How a statement quotes depends on its database, which the statement
  # does not say: whether a backslash escapes the quote after it (MySQL:
  # yes; PostgreSQL and SQLite: no, unless PostgreSQL runs with
  # standard_conforming_strings off, or MySQL with NO_BACKSLASH_ESCAPES),
  # whether /* */ nest (PostgreSQL) and whether # starts a comment
  # (MySQL; not as #> or #-, PostgreSQL's JSON operators). The statement is read in each of these ways (READINGS), and
  # whatever any reading takes for a literal or a comment is hidden: a text
  # is shown only where every reading agrees that it is the statement's
  # own. Where they disagree the shape loses some of its statement (from
  # the first disagreement on, at worst), never a value.
  module SQLShape
    # Bytes of a statement read at most: the rest is left out of its shape
    # (a literal cut there is hidden to its end like any unterminated one).
    # Markers keep 4,000 characters of it.
    INPUT_LIMIT = 16 * 1024
    # What can be neither a literal, nor a quoted name, nor a comment.
    CODE = %r{[^'"`$/\-#]+}
    STANDARD_BODY = /(?>[^']+|'')*'?/
    ESCAPED_BODY = /(?>[^'\\]+|\\(?:.|\z)|'')*'?/m
    NAME_BODY = { '"' => /(?>[^"]+|"")*"?/, "`" => /(?>[^`]+|``)*`?/ }.freeze
    ESCAPED_NAME_BODY = { '"' => /(?>[^"\\]+|\\(?:.|\z)|"")*"?/m, "`" => NAME_BODY["`"] }.freeze
    # A quoted name shown as it is.
    PLAIN_NAME = /\A(["`])[A-Za-z_][A-Za-z0-9_$]{0,62}\1\z/
    DOLLAR_TAG = /(?:[[:alpha:]_][[:alnum:]_]*)?\$/
    # Numbers, hexadecimal ones and those starting with "." (not the
    # digits of a name, nor $1 or :1 parameters).
    NUMBER = /(?<![\w$:])-?(?:0x\h+|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)(?![\w.])/i
    # The ways a statement is read: PostgreSQL (and with
    # standard_conforming_strings off), SQLite, MySQL (and with
    # NO_BACKSLASH_ESCAPES).
    Reading = Struct.new(:backslash, :nested, :pound)
    READINGS = [Reading.new(false, true, false), Reading.new(true, true, false), Reading.new(false, false, false),
                Reading.new(true, false, true), Reading.new(false, false, true)].freeze

    module_function

    # sql (a String) in its shape, as above.
    def shape(sql)
      sql = sql.to_s
      sql = sql.encode(Encoding::UTF_8, invalid: :replace, undef: :replace) unless sql.encoding.ascii_compatible?
      sql = sql.byteslice(0, INPUT_LIMIT) if sql.bytesize > INPUT_LIMIT
      sql = sql.scrub("?") unless sql.valid_encoding?
      build(sql, union(readings(sql).flat_map { |reading| hidden(sql, reading) }))
    end

    # The READINGS that read sql differently: without a backslash, with at
    # most one "/*" or without "#" in it, the readings that differ only
    # there agree (most statements are read once).
    def readings(sql)
      backslash = sql.include?("\\")
      nested = !(first = sql.index("/*")).nil? && !sql.index("/*", first + 2).nil?
      pound = sql.include?("#")
      READINGS.map { |r| Reading.new(backslash && r.backslash, nested && r.nested, pound && r.pound) }.uniq
    end

    # What a Reading hides: [from, to, literal] byte ranges in order
    # (literal false for a comment). Its backslash: whether \ escapes in
    # '...' and "..." (it always does in E'...'); nested: whether /* */
    # nest; pound: whether # starts a comment.
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
          s.skip((backslash ? ESCAPED_NAME_BODY : NAME_BODY).fetch(sql.byteslice(from, 1)))
          marks << [from, s.pos, true] unless sql.byteslice(from, s.pos - from).match?(PLAIN_NAME)
        when "$"
          next if word_byte?(sql, from - 1) || !s.skip(DOLLAR_TAG)

          s.skip_until(Regexp.new(Regexp.escape(sql.byteslice(from, s.pos - from)))) or s.terminate
          marks << [from, s.pos, true]
        when "/"
          marks << [from, block_comment_end(s, nested: reading.nested), false] if s.skip(/\*/)
        when "-"
          marks << [from, line_end(s), false] if s.skip(/-/)
        when "#"
          marks << [from, line_end(s), false] if reading.pound && !s.match?(/[>-]/) # (PostgreSQL's #> #>> #-)
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
