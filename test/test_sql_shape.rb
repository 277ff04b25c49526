# frozen_string_literal: true

require_relative "test_helper"
require "strobe/sql_shape"

# The shape of SQL keeps no literal, whichever way the database quotes it
# (issue 30, item 7): statements with random values quoted as PostgreSQL,
# MySQL and SQLite quote them, each value carrying a token of its own that
# its shape must not hold, whether it is shaped knowing its dialect or not.
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
      quote = @random.rand(3).zero? ? '"' : "'" # (MySQL reads "..." as a string)
      # (a value alone in double quotes looks like a name)
      value = value[/T\w{11}/] if quote == '"' && @random.rand(2).zero?
      "#{quote}#{value.gsub(/[\\'"\n\r\0]/, escapes)}#{quote}"
    else
      "'#{value.gsub("'", "''")}'" # SQLite: standard only
    end
  end

  def comment(dialect, text)
    case @random.rand(dialect == :mysql ? 3 : 2)
    when 0 then "/* #{text.gsub('*/', '')} */"
    when 1 then "-- #{text.tr("\r\n", '  ')}\n"
    else "#{['# ', '#', '#- ', '#> ', '#>> '][@random.rand(5)]}#{text.tr("\r\n", '  ')}\n"
    end
  end

  # A number as people and drivers write them: plain, decimal, grouped
  # with _ (PostgreSQL 16), hexadecimal, binary, octal.
  def number
    digits = @random.rand(10_000_000..99_999_999)
    case @random.rand(7)
    when 0 then digits.to_s
    when 1 then "#{digits}.#{@random.rand(10..99)}"
    when 2 then digits.to_s.reverse.scan(/\d{1,3}/).join("_").reverse
    when 3 then "0#{'xX'[@random.rand(2)]}#{digits.to_s(16)}"
    when 4 then "0#{'bB'[@random.rand(2)]}#{digits.to_s(2)}"
    when 5 then "0#{'oO'[@random.rand(2)]}#{digits.to_s(8)}"
    else "-#{digits}e#{@random.rand(1..9)}"
    end
  end

  # A statement of dialect with random values; [statement, its tokens].
  def statement(dialect)
    tokens = []
    lit = lambda do
      tokens << token
      literal(dialect, value(tokens.last))
    end
    num = lambda do
      tokens << number
      tokens.last
    end
    name = dialect == :mysql ? "`users`.`email`" : '"users"."email"'
    parts = ["SELECT #{name}, id FROM users WHERE #{name} = #{lit.call}",
             "AND name IN (#{lit.call}, #{lit.call})", "AND age > #{num.call}",
             "AND note LIKE #{lit.call}", "AND pins[#{num.call}:#{num.call}] = :#{num.call}"].shuffle(random: @random)
    parts.insert(@random.rand(parts.size), comment(dialect, value(tokens.push(token).last))) if @random.rand(2).zero?
    [parts.join(" "), tokens]
  end

  def test_no_value_of_a_statement_is_in_its_shape
    leaks = Hash.new { |h, k| h[k] = [] }
    counts = Hash.new(0)
    STATEMENTS.times do |i|
      dialect = %i[postgresql mysql sqlite][i % 3]
      sql, tokens = statement(dialect)
      [dialect, nil].each do |given|
        shape = Strobe::SQLShape.shape(sql, dialect: given)
        key = "#{dialect} (shaped as #{given || 'unknown'})"
        counts[key] += 1
        leaks[key] << [sql, shape] if tokens.any? { |t| shape.include?(t) }
      end
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

  # The review's statements (issue 30): MySQL's "..." strings, PostgreSQL
  # 16's grouped, binary and octal numbers, numbers after ":", and MySQL's
  # #- and #> comments.
  def test_the_reviewed_values_are_hidden
    {
      %q{SELECT * FROM users WHERE api_key = "sk_live_SECRET123" LIMIT 1} => [:mysql, "SECRET"],
      %q{UPDATE users SET password = "hunter2SECRET" WHERE id = 1} => [:mysql, "SECRET"],
      %q{SELECT * FROM acct WHERE balance = 1_234_567 AND pin = 4_321} => [:postgresql, /\d/],
      %q{SELECT 0b101010, 0o777, 0B11} => [:postgresql, /\d/],
      %q{SELECT * FROM t WHERE flags = 0b1011} => [:mysql, /\d/],
      %q{SELECT 1 #- email jane@x.com} => [:mysql, "jane"],
      %q{SELECT 1 #> ssn 123-45-6789} => [:mysql, /ssn|\d/],
      %q{SELECT pins[1:4242] FROM t} => [:postgresql, /\d/],
      %q{SELECT * FROM t WHERE a = :42} => [:sqlite, /\d/],
    }.each do |sql, (dialect, value)|
      [dialect, nil].each do |given|
        shape = Strobe::SQLShape.shape(sql, dialect: given)
        refute_match(value.is_a?(Regexp) ? value : /#{value}/, shape, "#{sql} as #{given.inspect}")
      end
    end
  end

  # The third review's (issue 30): quotes and comments a database reads
  # differently from the others. SQLite's [names] (a quote inside one
  # opened a literal no database sees) and $a$ parameters (no dollar
  # quotes); MySQL's -- (a comment only before a space: 1--'x' is 1 - -'x');
  # PostgreSQL's $$ after a number (a dollar quote) and ` (an operator, no
  # quote); MySQL with ANSI_QUOTES ("..." a name, '...' with escapes).
  def test_quotes_each_dialect_reads_its_own_way
    {
      "SELECT [it's] FROM t WHERE pw = 'SECRET1'" => :sqlite,
      "SELECT $a$, '$a$ SECRET3'" => :sqlite,
      "SELECT 1--'x\nSECRET2'" => :mysql,
      "SELECT 1$$SECRET5$$" => :postgresql,
      "SELECT 1 `, 'x` SECRET6'" => :postgresql,
      %q{SELECT "n\" , 'a\'b' , 'SECRET7' , "x"} => :mysql,
    }.each do |sql, dialect|
      [dialect, nil].each do |given|
        shape = Strobe::SQLShape.shape(sql, dialect: given)
        refute_match(/SECRET/, shape, "#{sql.inspect} as #{given.inspect}")
      end
    end
    assert_equal "SELECT [name] FROM [t] WHERE a = ?",
                 Strobe::SQLShape.shape("SELECT [name] FROM [t] WHERE a = 'x'", dialect: :sqlite)
    assert_equal "SELECT ?--?", Strobe::SQLShape.shape("SELECT 1--'x'", dialect: :mysql)
    assert_equal "SELECT ?", Strobe::SQLShape.shape("SELECT 1 -- 'x'", dialect: :mysql)
    assert_equal "SELECT a$$b FROM t", Strobe::SQLShape.shape("SELECT a$$b FROM t", dialect: :postgresql)
  end

  # Ordinary statements keep what they do; comments go. Without its
  # dialect, a statement's "..." are hidden (MySQL's strings).
  def test_shapes_stay_readable
    {
      ["SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = $1 AND t1.x = 'a''b' LIMIT 10", :postgresql] =>
        "SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = $1 AND t1.x = ? LIMIT ?",
      ["SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = ? AND t1.x = 'a''b' LIMIT 10", :sqlite] =>
        "SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = ? AND t1.x = ? LIMIT ?",
      ["SELECT \"posts\".* FROM \"posts\" WHERE \"posts\".\"id\" = $1 LIMIT 10", nil] =>
        "SELECT ?.* FROM ? WHERE ?.? = $1 LIMIT ?",
      ["SELECT `users`.* FROM `users` WHERE `users`.`email` = 'a@b.c' AND n = -1.5e3 /* app:web */", :mysql] =>
        "SELECT `users`.* FROM `users` WHERE `users`.`email` = ? AND n = ?",
      ["SELECT `users`.* FROM `users` WHERE `users`.`email` = \"a@b.c\" AND n = -1.5e3 /* app:web */", nil] =>
        "SELECT `users`.* FROM `users` WHERE `users`.`email` = ? AND n = ?",
      ["SELECT a FROM t WHERE b = .5 AND c = 0xDEAD AND d = $$x$$ AND e = $q$y$q$ -- note\nAND f = E'\\''", nil] =>
        "SELECT a FROM t WHERE b = ? AND c = ? AND d = ? AND e = ?\nAND f = ?",
      ["SELECT data #>> '{a,b}' FROM t WHERE x = U&'d\\0061t' AND b = X'0A' AND \"two words\" = 1", :postgresql] =>
        "SELECT data #>> ? FROM t WHERE x = ? AND b = ? AND ? = ?",
      ["SELECT data #>> '{a,b}', x FROM t -- no\nWHERE y = 1", nil] => "SELECT data ?\nWHERE y = ?",
      ["SELECT a[1:2], b::int, t1.c2 FROM t WHERE d = :3 AND e = $10", :postgresql] =>
        "SELECT a[?:?], b::int, t1.c2 FROM t WHERE d = :? AND e = $10",
    }.each { |(sql, dialect), shape| assert_equal shape, Strobe::SQLShape.shape(sql, dialect: dialect), sql }
  end

  def test_dialects
    assert_equal(%i[postgresql postgresql sqlite mysql mysql],
                 %w[PostgreSQL PostGIS SQLite Mysql2 Trilogy].map { |name| Strobe::SQLShape.dialect(name) })
    assert_nil Strobe::SQLShape.dialect("SQLServer")
    error = assert_raises(ArgumentError) { Strobe::SQLShape.shape("SELECT 1", dialect: :oracle) }
    assert_includes error.message, ":oracle"
  end

  # PostgreSQL takes any character above ASCII in a dollar quote's tag
  # (its lexer's dolq_start and dolq_cont): such a quote's text was kept
  # (second review). Bytes in any encoding are read.
  def test_dollar_tags_above_ascii
    ["$₁$SECRET1$₁$", "$a₁$SECRET2$a₁$", "$·$SECRET3$·$", "$ $SECRET4$ $"].each do |quoted|
      [:postgresql, nil].each do |dialect|
        shape = Strobe::SQLShape.shape("SELECT * FROM t WHERE a = #{quoted}", dialect: dialect)
        refute_match(/SECRET/, shape, "#{quoted} (#{dialect.inspect})")
      end
    end
    assert_equal "SELECT ? ?", Strobe::SQLShape.shape("SELECT $a$x\xff$a$ 1".b)
    assert_equal "SELECT ?", Strobe::SQLShape.shape("SELECT 'caf\u00e9'".encode("ISO-8859-1"))
  end


  # Shaping runs in the query's thread: only the first INPUT_LIMIT bytes
  # of a statement are read (a long one's rest is left out, never shown).
  def test_only_the_head_of_a_long_statement_is_read
    sql = "SELECT * FROM t WHERE a IN (#{(["'x'"] * 3000).join(', ')}) AND tail_column = 'v'"
    shape = Strobe::SQLShape.shape(sql, dialect: :postgresql)
    assert shape.start_with?("SELECT * FROM t WHERE a IN (?, ?, ?"), shape[0, 60]
    refute_includes shape, "tail_column"
    assert_operator shape.bytesize, :<=, Strobe::SQLShape::INPUT_LIMIT
    assert_operator Strobe::SQLShape::INPUT_LIMIT, :<=, 4096
  end
end
