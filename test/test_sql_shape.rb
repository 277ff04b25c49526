# frozen_string_literal: true

require_relative "test_helper"
require "strobe/sql_shape"

# The shape of SQL keeps no literal, whichever way the database quotes it
# (issue 30, item 7): statements with random values quoted as PostgreSQL,
# MySQL and SQLite quote them, each value carrying a token of its own that
# its shape must not hold.
class TestSQLShape < Minitest::Test
  ALNUM = [*"a".."z", *"A".."Z", *"0".."9"].freeze
  # What a value holds beside its token: e-mail addresses, quotes,
  # backslashes, doubled quotes, comment and dollar-quote openers, Unicode,
  # line breaks.
  PIECES = ["'", "''", "\\", "\\'", "\\\\", '"', '""', "`", "@example.com", "jane.doe@", "--", "#", "/*", "*/",
            "$$", "$q$", "é", "日本", "🙂", "\n", "\r\n", " ", ";", "%", "?", "0x1F", "1e5", "E'", "\t"].freeze
  STATEMENTS = 3000

  def setup
    @random = Random.new(30) # (the same statements every run)
  end

  def token
    "T#{Array.new(11) { ALNUM[@random.rand(ALNUM.size)] }.join}"
  end

  def value(token)
    pieces = Array.new(@random.rand(0..5)) { PIECES[@random.rand(PIECES.size)] }
    pieces.insert(@random.rand(0..pieces.size), token).join
  end

  # value as a literal of dialect, quoted as its drivers quote it (and as
  # people write it by hand).
  def literal(dialect, value)
    case dialect
    when :postgresql
      case @random.rand(3)
      when 0 then "'#{value.gsub("'", "''")}'"
      when 1 then "E'#{value.gsub(/[\\']/) { |c| "\\#{c}" }}'"
      else
        tag = ["", "q", "body_1"][@random.rand(3)]
        value = value.gsub("$#{tag}$", "") while value.include?("$#{tag}$")
        "$#{tag}$#{value}$#{tag}$"
      end
    when :mysql
      # mysql2's and trilogy's escape, or with the quotes doubled (which
      # MySQL reads too).
      escapes = { "\\" => "\\\\", "'" => @random.rand(4).zero? ? "''" : "\\'", '"' => '\\"', "\n" => "\\n",
                  "\r" => "\\r", "\0" => "\\0" }
      "'#{value.gsub(/[\\'"\n\r\0]/, escapes)}'"
    else
      "'#{value.gsub("'", "''")}'" # SQLite: standard only
    end
  end

  def comment(dialect, text)
    case @random.rand(dialect == :mysql ? 3 : 2)
    when 0 then "/* #{text.gsub('*/', '')} */"
    when 1 then "-- #{text.tr("\r\n", '  ')}\n"
    else "# #{text.tr("\r\n", '  ')}\n"
    end
  end

  # A statement of dialect with random values; [statement, its tokens].
  def statement(dialect)
    tokens = []
    lit = lambda do
      tokens << token
      literal(dialect, value(tokens.last))
    end
    number = lambda do
      tokens << @random.rand(10_000_000..99_999_999).to_s
      tokens.last
    end
    name = dialect == :mysql ? "`users`.`email`" : '"users"."email"'
    parts = ["SELECT #{name}, id FROM users WHERE #{name} = #{lit.call}",
             "AND name IN (#{lit.call}, #{lit.call})", "AND age > #{number.call}",
             "AND note LIKE #{lit.call}"].shuffle(random: @random)
    parts.insert(@random.rand(parts.size), comment(dialect, value(tokens.push(token).last))) if @random.rand(2).zero?
    [parts.join(" "), tokens]
  end

  def test_no_value_of_a_statement_is_in_its_shape
    leaks = Hash.new { |h, k| h[k] = [] }
    counts = Hash.new(0)
    STATEMENTS.times do |i|
      dialect = %i[postgresql mysql sqlite][i % 3]
      sql, tokens = statement(dialect)
      shape = Strobe::SQLShape.shape(sql)
      counts[dialect] += 1
      leaks[dialect] << [sql, shape] if tokens.any? { |t| shape.include?(t) }
    end
    summary = leaks.map { |d, l| "#{d}: #{l.size} of #{counts[d]}" }.join(", ")
    example = leaks.values.first&.first
    assert_empty leaks, "values left in shapes (#{summary}), e.g. #{example.inspect}"
  end

  # The issue's statement: two backslash-escaped apostrophes pair up every
  # quote when \ is read as a character.
  def test_backslash_escapes_that_pair_up_as_standard_quotes
    sql = "UPDATE users SET name = 'O\\'Brien', email = 'jane@example.com', city = 'L\\'Aquila' WHERE id = 7"
    shape = Strobe::SQLShape.shape(sql)
    refute_match(/jane|example|Aquila|Brien/, shape)
    assert_equal "UPDATE users SET name = ?", shape[0, 25]
  end

  # Ordinary statements keep what they do; comments go.
  def test_shapes_stay_readable
    {
      "SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = $1 AND t1.x = 'a''b' LIMIT 10" =>
        "SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = $1 AND t1.x = ? LIMIT ?",
      "SELECT `users`.* FROM `users` WHERE `users`.`email` = 'a@b.c' AND n = -1.5e3 /* app:web */" =>
        "SELECT `users`.* FROM `users` WHERE `users`.`email` = ? AND n = ?",
      "SELECT a FROM t WHERE b = .5 AND c = 0xDEAD AND d = $$x$$ AND e = $q$y$q$ -- note\nAND f = E'\\''" =>
        "SELECT a FROM t WHERE b = ? AND c = ? AND d = ? AND e = ?\nAND f = ?",
      "SELECT data #>> '{a,b}' FROM t WHERE x = U&'d\\0061t' AND b = X'0A' AND \"two words\" = 1" =>
        "SELECT data #>> ? FROM t WHERE x = ? AND b = ? AND ? = ?",
    }.each { |sql, shape| assert_equal shape, Strobe::SQLShape.shape(sql), sql }
  end
end
